package continuation

// DisableFast turns t's fast path off (the differential tests' reference).
func DisableFast(t *Tracker) { t.noFast = true }

// FastChunks is how many chunks t read through its fast path.
func FastChunks(t *Tracker) int { return t.fastChunks }
