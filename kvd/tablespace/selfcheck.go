package tablespace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// SelfCheck measures the sustained write speed of the first path with the
// tablespace's IO mode (O_DIRECT or buffered, slot-sized writes, one
// fdatasync at the end) on a scratch file that it removes afterwards.
func (t *Tablespace) SelfCheck(ctx context.Context) (float64, error) {
	if t.closed.Load() {
		return 0, ErrClosed
	}
	s := t.shards[0]
	path := filepath.Join(s.dir, "selfcheck.tmp")
	flags := os.O_RDWR | os.O_CREATE | os.O_TRUNC
	if s.direct {
		flags |= syscall.O_DIRECT
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return 0, fmt.Errorf("tablespace self-check: %w", err)
	}
	defer os.Remove(path)
	defer f.Close()
	bp := t.getBuf()
	defer t.putBuf(bp)
	b := *bp
	for i := range b {
		b[i] = byte(i*131 + 7)
	}
	fd := int(f.Fd())
	start := time.Now()
	var off int64
	for off < t.cfg.SelfCheckBytes {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("tablespace self-check: %w", err)
		}
		if err := pwriteFull(fd, b, off); err != nil {
			return 0, fmt.Errorf("tablespace self-check write: %w", err)
		}
		off += int64(len(b))
	}
	if err := fdatasync(fd); err != nil {
		return 0, fmt.Errorf("tablespace self-check sync: %w", err)
	}
	secs := time.Since(start).Seconds()
	bps := float64(off) / max(secs, 1e-9)
	t.log.Info().Float64("bytes_per_second", bps).Float64("seconds", secs).Bool("direct_io", s.direct).Msg("tablespace self-check")
	return bps, nil
}
