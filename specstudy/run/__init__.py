"""Running a study: the plan (:mod:`.plan`), engines (:mod:`.pool`), one cell (:mod:`.cell`), the serving
driver (:mod:`.serving`), the loop with resume (:mod:`.study`) and the machine check (:mod:`.environment`)."""
