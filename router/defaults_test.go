package router_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

// TestDefaultsAreServeFlagDefaults: the router's and the policy's defaults
// are the flag defaults of `infera serve`, declared once in config.
func TestDefaultsAreServeFlagDefaults(t *testing.T) {
	s := config.DefaultServe()
	c := router.DefaultConfig()
	if c.MaxRetries != s.RequestMaxRetries || c.ConnectTimeout != s.UpstreamConnectTimeout ||
		c.MaxBodyBytes != s.MaxBodyBytes || c.TTFTTimeout != s.TTFTTimeout || c.MaxConnections != s.MaxConnections {
		t.Fatalf("router defaults %+v differ from the serve flag defaults", c)
	}
	if c.MaxRetries != 1 || c.BreakerThreshold != 3 || c.IdleConnTimeout != 3*time.Second {
		t.Fatalf("router defaults %+v", c)
	}
	k := router.DefaultKVAwareConfig()
	if k.OverlapWeight != s.KV.OverlapWeight || k.PrefillOverlapWeight != k.OverlapWeight ||
		k.DecodeOverlapWeight != k.OverlapWeight || k.RecentHalfLife != s.KV.RecentDecay ||
		k.DefaultBlockSize != s.KV.BlockSize || k.EngineIdleConnTimeout <= 0 {
		t.Fatalf("kv-aware defaults %+v differ from the serve flag defaults %+v", k, s.KV)
	}
	if k.MaxShare != s.KV.MaxShare || k.MaxShare != 1.1 || k.MaxShareWarm != s.KV.MaxShareWarm || k.MaxShareWarm != 1.15 || k.ProvisionalTTL != s.KV.ProvisionalTTL ||
		k.ProvisionalMaxBlocks != s.KV.ProvisionalMaxBlocks || k.Subscriber.RebuildAfter != s.KV.RebuildAfter ||
		k.ProvisionalTTL != 2*time.Second || k.Subscriber.RebuildAfter != 5*time.Second {
		t.Fatalf("kv-aware issue-11 defaults %+v differ from the serve flag defaults %+v", k, s.KV)
	}
	// Zero means zero: no share bound, no provisional hits, rebuild only
	// on a cleared cache.
	kv := s.KV
	kv.MaxShare, kv.MaxShareWarm, kv.ProvisionalTTL, kv.RebuildAfter = 0, 0, 0, 0
	if z := router.ServeKVAwareConfig(kv); z.MaxShare != 0 || z.MaxShareWarm != 0 || z.ProvisionalTTL != 0 || z.Subscriber.RebuildAfter != 0 {
		t.Fatalf("zeros not kept: %+v", z)
	}
}

// TestConfigZeroMeansZero: zero weights and a zero half-life are accepted
// as such; a zero where none makes sense is rejected, not replaced.
func TestConfigZeroMeansZero(t *testing.T) {
	if _, err := router.New(withConfig(func(c *router.Config) { c.MaxRetries = 0 }), router.RoundRobin{}, testLog(t)); err != nil {
		t.Fatalf("zero retries: %v", err)
	}
	for name, set := range map[string]func(*router.Config){
		"connect timeout": func(c *router.Config) { c.ConnectTimeout = 0 },
		"max body bytes":  func(c *router.Config) { c.MaxBodyBytes = 0 },
		"negative retry":  func(c *router.Config) { c.MaxRetries = -1 },
		"zero config":     func(c *router.Config) { *c = router.Config{} },
	} {
		if _, err := router.New(withConfig(set), router.RoundRobin{}, testLog(t)); !errors.Is(err, router.ErrConfig) {
			t.Errorf("%s: err %v, want ErrConfig", name, err)
		}
	}
	newKV(t, kvConfig(func(c *router.KVAwareConfig) {
		c.OverlapWeight, c.PrefillOverlapWeight, c.DecodeOverlapWeight, c.RecentWeight, c.RecentHalfLife = 0, 0, 0, 0, 0
	}))
	for name, set := range map[string]func(*router.KVAwareConfig){
		"block size":      func(c *router.KVAwareConfig) { c.DefaultBlockSize = 0 },
		"index bound":     func(c *router.KVAwareConfig) { c.IndexMaxBlocks = 0 },
		"approx ttl":      func(c *router.KVAwareConfig) { c.ApproxTTL = 0 },
		"negative weight": func(c *router.KVAwareConfig) { c.DecodeOverlapWeight = -1 },
		"half-life":       func(c *router.KVAwareConfig) { c.RecentHalfLife = -time.Second },
		"engine timeout":  func(c *router.KVAwareConfig) { c.EngineTokenizeTimeout = 0 },
	} {
		if p, err := router.NewKVAware(kvConfig(set), testLog(t)); !errors.Is(err, router.ErrKVConfig) {
			if p != nil {
				_ = p.Close()
			}
			t.Errorf("%s: err %v, want ErrKVConfig", name, err)
		}
	}
}

// TestNoRetriesNoFailover: MaxRetries 0 means a failed first worker fails
// the request, where the default retries it on the next.
func TestNoRetriesNoFailover(t *testing.T) {
	down, good := downUpstream(t), jsonUpstream(t)
	tr := startRouter(t, prefer{down.addr}, withConfig(func(c *router.Config) { c.MaxRetries = 0 }),
		record(down, "m", discovery.StatusActive), record(good, "m", discovery.StatusActive))
	resp, body := tr.chat(t, "m")
	if resp.StatusCode < 500 || strings.Contains(string(body), good.addr) {
		t.Fatalf("status %d body %s: want a 5xx without failover", resp.StatusCode, body)
	}
	if got := metric(t, tr, `infera_router_retries_total{reason="connect"}`); got != 0 {
		t.Fatalf("retries_total{connect} = %v, want 0", got)
	}
}
