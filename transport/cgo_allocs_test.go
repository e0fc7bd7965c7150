//go:build mooncake && mori && cgo

package transport

import (
	"context"
	"testing"
)

// The shims allocate nothing per transfer either: request arrays live in
// pooled C memory, statuses in the pooled batch.
func TestCgoZeroAllocs(t *testing.T) {
	mp, md := mooncakePair(t)
	op, od, _ := moriPair(t)
	for name, pair := range map[string][2]Engine{"mooncake": {mp, md}, "mori": {op, od}} {
		t.Run(name, func(t *testing.T) {
			remote := mustRegister(t, pair[0], "kv-allocs", hostBuf(t, 64<<10))
			local := mustRegister(t, pair[1], "l-allocs", hostBuf(t, 64<<10))
			ops := []Op{
				{Kind: Read, Local: local, Remote: remote.Desc(), Len: 32 << 10},
				{Kind: Write, Local: local, LocalOff: 32 << 10, Remote: remote.Desc(), RemoteOff: 32 << 10, Len: 32 << 10},
			}
			ctx := context.Background()
			if err := Transfer(ctx, pair[1], ops); err != nil {
				t.Fatal(err)
			}
			var err error
			allocs := testing.AllocsPerRun(100, func() {
				if e := Transfer(ctx, pair[1], ops); e != nil {
					err = e
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if allocs != 0 {
				t.Fatalf("%v allocations per transfer, want 0", allocs)
			}
		})
	}
}
