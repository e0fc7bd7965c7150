package freeport

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// HeldFor is how long a block handed out stays out of reach: longer than
// a server takes to bind the ports it was given.
const HeldFor = 5 * time.Minute

// pickAttempts bounds Pick's tries.
const pickAttempts = 64

var handedOut = ledger{blocks: map[int]lease{}}

type lease struct {
	n     int
	until time.Time
}

type ledger struct {
	mu     sync.Mutex
	blocks map[int]lease // base port → its block
}

// claim records base..base+n-1 as handed out at now, unless it overlaps a
// block handed out within HeldFor (false).
func (l *ledger) claim(base, n int, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for b, ls := range l.blocks {
		if now.After(ls.until) {
			delete(l.blocks, b)
			continue
		}
		if base < b+ls.n && b < base+n {
			return false
		}
	}
	l.blocks[base] = lease{n: n, until: now.Add(HeldFor)}
	return true
}

// Claim records the ports base..base+n-1 as handed out by this process,
// or reports false when one of them was handed out within HeldFor: the
// caller found them free and must look for others.
func Claim(base, n int) bool { return handedOut.claim(base, n, time.Now()) }

// Pick returns a port the kernel reports free on host and this process has
// not handed out within HeldFor, claimed.
func Pick(host string) (int, error) {
	for range pickAttempts {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, fmt.Errorf("find a free port on %q: %w", host, err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		if err := l.Close(); err != nil {
			return 0, fmt.Errorf("find a free port on %q: %w", host, err)
		}
		if Claim(p, 1) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("find a free port on %q: every one of %d the kernel offered was handed out moments ago", host, pickAttempts)
}
