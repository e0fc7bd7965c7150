package continuation

// DisableFast turns t's fast path off (the differential tests' reference).
func DisableFast(t *Tracker) { t.noFast = true }

// FastChunks is how many chunks t read through its fast path.
func FastChunks(t *Tracker) int { return t.fastChunks }

// Rebases and Restamps are how many times t moved a layout to another
// stream's id, time and model: by reading a chunk through it, and by
// taking them from another layout.
func Rebases(t *Tracker) int  { return t.rebases }
func Restamps(t *Tracker) int { return t.restamps }

// Tries is how many layouts t tried on the chunks of its stream.
func Tries(t *Tracker) int { return t.tries }

// HoldsLayouts reports whether t holds a set of layouts.
func HoldsLayouts(t *Tracker) bool { return t.lay != nil }
