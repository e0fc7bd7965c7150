package config

import (
	"time"

	"github.com/urfave/cli/v2"
)

// SimKVD configures kvd as the simulator's second-level cache (sim/kvd.go):
// a prefix block its GPU cache evicts is stored in kvd, and a later prompt
// whose prefix the GPU cache lost loads it back from kvd at
// LoadMsPerBlock instead of recomputing it at --prefill-tokens-per-s.
type SimKVD struct {
	// Socket is the daemon's Unix socket; empty = no kvd.
	Socket string
	// CompatKey is the namespace compat_key of the blocks (the connectors'
	// "tp<r>of<n>_pp<r>of<n>"); the model is the served model name.
	CompatKey string
	// BlockBytes is the size of the value stored per block.
	BlockBytes int
	// LoadMsPerBlock is the modelled time to load one block from kvd
	// (before --time-scale).
	LoadMsPerBlock float64
	// Retention of the stored blocks: long ones go down to kvd's L3.
	Retention string
	// Timeout bounds one kvd request; a kvd that does not answer in time
	// is skipped (recompute) and dialed again later.
	Timeout time.Duration
	// WriteThrough stores every block when the GPU cache takes it (as
	// vLLM's kvd connector saves what it computes, off the token path)
	// instead of when it is evicted.
	WriteThrough bool
}

func (k *SimKVD) flags() []cli.Flag {
	return []cli.Flag{
		String("kvd-socket", "Unix socket of infera kvd, the second-level cache: blocks the GPU cache evicts are stored there and loaded back (at --kvd-load-ms-per-block) instead of recomputed (empty = none)", &k.Socket, ""),
		String("kvd-compat-key", "kvd namespace compat_key of the blocks (the model is the served model name)", &k.CompatKey, "tp0of1_pp0of1"),
		Int("kvd-block-bytes", "bytes stored in kvd per KV block", &k.BlockBytes, 64<<10),
		Float("kvd-load-ms-per-block", "modelled time to load one block from kvd, in ms (a recompute costs block-size / prefill-tokens-per-s)", &k.LoadMsPerBlock, 0.1),
		String("kvd-retention", "retention of the blocks stored in kvd: none, ephemeral, short or long (long ones go down to kvd's L3)", &k.Retention, "long"),
		Duration("kvd-timeout", "longest kvd request; past it the block is recomputed and kvd dialed again later", &k.Timeout, 200*time.Millisecond),
		Bool("kvd-write-through", "store each block in kvd when it is computed (as vLLM's kvd connector saves what it computes), not when the GPU cache evicts it, so other hosts' kvds can pull it at once", &k.WriteThrough, false),
	}
}

func (k *SimKVD) validate(p *Problems) {
	if k.Socket == "" {
		return
	}
	if !ValidKVDSocket(k.Socket) {
		p.Addf("--kvd-socket %q: want an absolute path of at most 103 bytes", k.Socket)
	}
	if len(k.CompatKey) > 1024 {
		p.Addf("--kvd-compat-key must be at most 1024 bytes")
	}
	if k.BlockBytes < 16 || k.BlockBytes > 64<<20 {
		p.Addf("--kvd-block-bytes %d: want 16 to 67108864", k.BlockBytes)
	}
	if !(k.LoadMsPerBlock >= 0 && k.LoadMsPerBlock <= 1e6) {
		p.Addf("--kvd-load-ms-per-block must be from 0 to 1e6")
	}
	switch k.Retention {
	case "none", "ephemeral", "short", "long":
	default:
		p.Addf("--kvd-retention %q: want none, ephemeral, short or long", k.Retention)
	}
	if k.Timeout <= 0 {
		p.Addf("--kvd-timeout must be positive")
	}
}
