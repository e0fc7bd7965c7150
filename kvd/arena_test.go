package kvd

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
)

// TestArenaFallbacks: hugetlb and mlock are best effort; without huge
// pages reserved (or memlock headroom) the arena still works.
func TestArenaFallbacks(t *testing.T) {
	a, fallbacks, err := OpenArena(3<<20, true, true)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !a.Hugetlb && len(fallbacks) == 0 {
		t.Fatal("hugetlb not active and no fallback reported")
	}
	if a.Hugetlb && a.Size()%hugePage != 0 {
		t.Fatalf("hugetlb arena of %d bytes", a.Size())
	}
	beginWrite(a.mem, 0)
	copy(a.mem[HeaderBytes:], "hello")
	v := endWrite(a.mem, 0, 5)
	if got, err := ReadSlot(a.mem, HeaderBytes, 5, v, nil); err != nil || string(got) != "hello" {
		t.Fatalf("read %q %v", got, err)
	}
	if _, err := ReadSlot(a.mem, HeaderBytes, 5, v+2, nil); err == nil {
		t.Fatal("a stale version was read")
	}
	if _, err := ReadSlot(a.mem, int(a.Size()), 5, v, nil); err == nil {
		t.Fatal("an offset outside the arena was read")
	}
	if _, _, err := OpenArena(10, false, false); err == nil {
		t.Fatal("a 10-byte arena opened")
	}
}

// TestSeqlockNeverServesWrongBytes: while writers keep overwriting a few
// keys (every value is its key and a counter repeated), zero-copy readers
// in other connections either read a whole, correct value or a miss —
// never a mix of two values or another key's bytes.
// Large values (≥ unlockedCopyBytes) are copied without the store's lock,
// so writers of the same key race to publish.
func TestSeqlockNeverServesWrongBytes(t *testing.T) {
	for _, n := range []int{1000, unlockedCopyBytes + 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { seqlockRace(t, n) })
	}
}

func seqlockRace(t *testing.T, n int) {
	slot := (n/12*12 + HeaderBytes + SlotAlign - 1) / SlotAlign * SlotAlign
	// 6 slots for 4 keys: slots get reused.
	d := startDaemon(t, daemonOpts{arenaBytes: int64(6 * slot), storeOpt: func(o *StoreOptions) { o.SlotBytes = slot }})
	mk := func(k, ctr int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("k%02d-c%06d;", k, ctr)), n/12)
	}
	var writers, readers sync.WaitGroup
	errs := make(chan error, 4) // each goroutine sends at most one
	stop := make(chan struct{})
	for w := range 2 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			c, err := Dial(context.Background(), d.path, ClientOptions{SharedArena: true})
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for i := range 200 {
				k := (i + w) % 4
				var ok bool
				if i%2 == 0 {
					ok, _, err = c.Set(ns, key(k), mk(k, i), SetOptions{})
				} else {
					ok, _, err = c.SetZeroCopy(ns, key(k), mk(k, i), SetOptions{})
				}
				if err != nil || !ok {
					errs <- fmt.Errorf("set: ok=%v %v", ok, err)
					return
				}
			}
		}()
	}
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			c, err := Dial(context.Background(), d.path, ClientOptions{SharedArena: true})
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			var dst []byte
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := i % 4
				var ok bool
				dst, _, ok, err = c.Get(ns, key(k), dst)
				if err != nil {
					errs <- err
					return
				}
				if !ok {
					continue
				}
				unit := dst[:12]
				if !bytes.HasPrefix(unit, []byte(fmt.Sprintf("k%02d-", k))) || !bytes.Equal(dst, bytes.Repeat(unit, len(dst)/12)) {
					errs <- fmt.Errorf("key %d served wrong bytes: %.40q", k, dst)
					return
				}
			}
		}()
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
