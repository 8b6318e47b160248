"""Pure analysis of a study's records: load once (:mod:`.study`), tidy frames (:mod:`.frames`), pooled
statistics (:mod:`.stats`), the tables' rows as typed values (:mod:`.rows`), verdicts from intervals
(:mod:`.claims`).  Numbers and decisions only: the words and figures are :mod:`specstudy.report`'s.
Nothing here writes a file."""
