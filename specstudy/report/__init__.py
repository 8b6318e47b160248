"""The report: the tables' cells and the FAQ Q4 sentences made from the analysis's typed rows
(:mod:`.tables`, :mod:`.fails`, :mod:`.summary`), sections assembled from them (:mod:`.sections`), the
one writer of its files (:mod:`.writer`), and the notebooks' papermill jobs (:mod:`.notebooks`)."""
