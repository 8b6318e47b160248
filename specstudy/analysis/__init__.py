"""Pure analysis of a study's records: load once (:mod:`.study`), tidy frames (:mod:`.frames`), pooled
statistics (:mod:`.stats`), the tables' rows as typed values (:mod:`.rows`), verdicts from intervals
(:mod:`.claims`), figures as ``Figure`` objects (:mod:`.figures`).  Nothing here writes a file."""
