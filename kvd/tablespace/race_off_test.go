//go:build !race

package tablespace

const raceEnabled = false
