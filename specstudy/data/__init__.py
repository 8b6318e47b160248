"""What the kit reads: pinned wheels (:mod:`.fetch`), models (:mod:`.models`) and task prompts (:mod:`.tasks`)."""
