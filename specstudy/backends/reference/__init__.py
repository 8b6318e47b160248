"""The kit's own engine (:mod:`specstudy.engine`) as a backend: every method family, in process."""
