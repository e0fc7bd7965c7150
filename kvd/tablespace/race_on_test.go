//go:build race

package tablespace

// raceEnabled: sync.Pool drops items at random under the race detector
// (an overwriting Put then allocates its buffer), so the allocation count
// of a pooled path is only checked without it (CI runs the Alloc tests
// without -race too).
const raceEnabled = true
