"""The report: sections assembled from the analysis (:mod:`.sections`), the one writer of its files
(:mod:`.writer`), and the notebooks' papermill jobs (:mod:`.notebooks`)."""
