"""Pure analysis of a study's records: load once (:mod:`.study`), tidy frames (:mod:`.frames`), pooled
statistics (:mod:`.stats`), tables as DataFrames (:mod:`.tables`, :mod:`.fails`, :mod:`.conditions`),
figures as ``Figure`` objects (:mod:`.figures`).  Nothing here writes a file."""
