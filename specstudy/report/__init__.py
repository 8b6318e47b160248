"""The report: the tables' cells, the sentences and the figures made from the analysis's typed rows
and verdicts (:mod:`.tables`, :mod:`.fails`, :mod:`.summary`, :mod:`.wording`, :mod:`.figures`),
sections assembled from them (:mod:`.sections`), the one writer of its files (:mod:`.writer`), and the
notebooks' papermill jobs (:mod:`.notebooks`)."""
