package router

import (
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/natsx"
)

// engineIdleConnTimeout is KVAwareConfig.EngineIdleConnTimeout's default (no
// flag): below the engines' keep-alive (uvicorn: 5s).
const engineIdleConnTimeout = 3 * time.Second

// DefaultConfig returns the router's defaults: the flag defaults of `infera
// serve` (config.DefaultServe), the one place they are declared.
func DefaultConfig() Config { return ServeConfig(config.DefaultServe()) }

// DefaultKVAwareConfig returns the kv-aware policy's defaults: the flag
// defaults of `infera serve`.
func DefaultKVAwareConfig() KVAwareConfig {
	return ServeKVAwareConfig(config.DefaultServe().KV)
}

// ServeConfig maps the flags of `infera serve` onto the router's
// configuration (API keys as read by s.Validate).
func ServeConfig(s config.Serve) Config {
	return Config{
		MaxBodyBytes:      s.MaxBodyBytes,
		ClientReadTimeout: s.ClientReadTimeout,
		ClientIdleTimeout: s.ClientIdleTimeout,
		ConnectTimeout:    s.UpstreamConnectTimeout,
		UpstreamTimeout:   s.UpstreamTimeout,
		IdleConnTimeout:   s.UpstreamIdleConnTimeout,
		MaxConnsPerWorker: s.MaxConnsPerWorker,
		ShutdownTimeout:   s.ShutdownTimeout,

		MaxRetries:           s.RequestMaxRetries,
		MigrationLimit:       s.MigrationLimit,
		Direct:               s.RouterMode == "direct",
		BreakerThreshold:     s.BreakerFailureThreshold,
		BreakerCooldown:      s.BreakerCooldown,
		BreakerMaxCool:       s.BreakerMaxCooldown,
		MaxInflightPerWorker: s.MaxInflightPerWorker,
		QueueTimeout:         s.QueueTimeout,
		TTFTTimeout:          s.TTFTTimeout,
		StreamIdleTimeout:    s.StreamIdleTimeout,
		RequestTimeout:       s.RequestTimeout,
		HeartbeatInterval:    s.HeartbeatInterval,
		StallWindow:          s.StallWindow,
		StallProbeInterval:   s.StallProbeInterval,
		MaxTokensCeiling:     s.MaxTokensCeiling,
		PDPrefillTimeout:     s.PDPrefillTimeout,
		PDMinUncachedTokens:  s.PDMinUncachedTokens,
		APIKeys:              s.Keys(),
		AdminToken:           s.AdminToken,
		AdminSeparate:        s.AdminListen != "",
		EnableProfiling:      s.EnableProfiling,
		MaxHeaderBytes:       s.MaxHeaderBytes,
		ClientWriteTimeout:   s.ClientWriteTimeout,
		MaxConnections:       s.MaxConnections,
		MaxConnectionsPerIP:  s.MaxConnectionsPerIP,
		ClientHeaderTimeout:  s.ClientHeaderTimeout,
		BodyBudgetBytes:      s.BodyBudgetBytes,
		LogPrompts:           s.LogPrompts,
		KVDSocket:            s.KVDSocket,
	}
}

// ServeKVAwareConfig maps the kv-aware flags of `infera serve` onto the
// policy's configuration.
func ServeKVAwareConfig(k config.ServeKV) KVAwareConfig {
	sub := kvcache.DefaultSubscriberConfig()
	sub.RebuildAfter = k.RebuildAfter
	return KVAwareConfig{
		TokenizerSpec:         k.Tokenizer,
		EngineTokenizeTimeout: k.EngineTokenizeTimeout,
		EngineIdleConnTimeout: engineIdleConnTimeout,
		OverlapWeight:         k.OverlapWeight,
		PrefillOverlapWeight:  k.PrefillOverlapWeight,
		DecodeOverlapWeight:   k.DecodeOverlapWeight,
		DefaultBlockSize:      k.BlockSize,
		IndexMaxBlocks:        k.IndexMaxBlocks,
		ApproxTTL:             k.ApproxTTL,
		ApproxMaxBlocks:       k.ApproxMaxBlocks,
		RecentHalfLife:        k.RecentDecay,
		RecentWeight:          k.RecentWeight,
		MaxShare:              k.MaxShare,
		MaxShareWarm:          k.MaxShareWarm,
		Cost:                  k.Cost,
		EventsListen:          k.EventsListen,
		ProvisionalTTL:        k.ProvisionalTTL,
		ProvisionalMaxBlocks:  k.ProvisionalMaxBlocks,
		CoalesceWait:          k.CoalesceWait,
		DivergenceOff:         !k.DivergenceCheck,
		Subscriber:            sub,
		EventTransport:        k.EventTransport,
		NATS:                  natsx.Config{URL: k.NATS.URL, CredsFile: k.NATS.CredsFile, NKeyFile: k.NATS.NKeyFile, CAFile: k.NATS.CAFile},
		PeerHints:             k.PeerHints,
		PeerSecret:            k.PeerSecret,
		PeerWait:              k.PeerWait,
	}
}
