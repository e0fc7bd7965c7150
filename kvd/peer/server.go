package peer

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/infera/infera/internal/logpace"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/transport"
)

const headerBytes = kvd.HeaderBytes

// RegionName is the name of a kvd's arena region on its transport engine.
const RegionName = "kvd-arena"

// ServerOptions configure a Server.
type ServerOptions struct {
	// Secret, when set, must open every request.
	Secret []byte
	// Allow limits control connections to these networks (empty: any,
	// unless Registered is set).
	Allow []netip.Prefix
	// Registered, when set, fences the listener by the kvd registry: a
	// connection is served only when its source address is the host of a
	// registered kvd (Registered reports it) or lies in Allow (routers
	// sending hints are not kvds: their networks go in Allow). It is
	// called once per accepted connection and must be safe for concurrent
	// use; before the registry is known it should report false (closed).
	Registered func(netip.Addr) bool
	// IdleTimeout closes a control connection without a request for this
	// long (default 60 s).
	IdleTimeout time.Duration
	// Hint, when set, takes hint requests (hint.go): a router asking this
	// kvd to pull blocks from another one. Nil refuses them.
	Hint HintFunc
	Log  zerolog.Logger
}

// ServerStats count what the source served.
type ServerStats struct {
	Requests, Located, Denied, Refused, Hints int64
	// Unregistered counts the refused connections (within Refused) whose
	// source was not a registered kvd (ServerOptions.Registered).
	Unregistered int64
}

// Server answers locate requests for a store whose arena it registered on
// a transport engine.
type Server struct {
	store  *kvd.Store
	eng    transport.Engine
	region *transport.Region
	opt    ServerOptions

	requests, located, denied, refused, hints atomic.Int64
	unregistered                              atomic.Int64 // refused: not a registered kvd
	refusedLog                                refusalLog
}

// refusalLogEvery paces the log line of refused connections.
const refusalLogEvery = 10 * time.Second

// refusalLog logs refused connections at most once per refusalLogEvery,
// saying how many went unlogged since.
type refusalLog struct{ pace logpace.Pacer }

func (l *refusalLog) log(log zerolog.Logger, peer net.Addr, registry bool) {
	ok, n := l.pace.Allow(refusalLogEvery)
	if !ok {
		return
	}
	msg := "kvd peer: connection refused: source outside --peer-allow"
	if registry {
		msg = "kvd peer: connection refused: source is not a registered kvd's host nor in --peer-allow"
	}
	log.Warn().Str("peer", peer.String()).Int64("suppressed", n).Msg(msg)
}

// NewServer registers the store's arena on eng (which serves it to
// pullers) and returns the server of its locate requests.
func NewServer(store *kvd.Store, eng transport.Engine, opt ServerOptions) (*Server, error) {
	a := store.Arena()
	if a == nil {
		return nil, errors.New("peer: the store has no shared arena to serve")
	}
	if opt.IdleTimeout <= 0 {
		opt.IdleTimeout = 60 * time.Second
	}
	r, err := eng.Register(RegionName, a.Memory())
	if err != nil {
		return nil, fmt.Errorf("peer: register the arena: %w", err)
	}
	return &Server{store: store, eng: eng, region: r, opt: opt}, nil
}

// Region is the arena's descriptor, as pullers see it.
func (s *Server) Region() transport.Desc { return s.region.Desc() }

// Stats returns the counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{Requests: s.requests.Load(), Located: s.located.Load(), Denied: s.denied.Load(), Refused: s.refused.Load(),
		Unregistered: s.unregistered.Load(), Hints: s.hints.Load()}
}

// Close deregisters the arena (the engine is its owner's to close).
func (s *Server) Close() error { return s.eng.Deregister(s.region) }

// Serve answers locate requests on ln until ctx ends; it returns after
// every connection it started has finished. Accept errors that pass (fd
// exhaustion) are waited out.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer func() {
		stop()
		wg.Wait()
	}()
	var retry kvd.AcceptRetry
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if retry.Wait(ctx, err, s.opt.Log, "kvd-peer") {
				continue
			}
			return fmt.Errorf("peer: accept: %w", err)
		}
		retry.Reset()
		if !s.Admit(c.RemoteAddr()) {
			c.Close()
			continue
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			c.Close()
		}()
	}
}

// Admit decides on a connection from remote as the listener does (Allow,
// Registered), counting and logging a refusal. The kvd command also fences
// its arena's transport port with it (transport.TCPConfig.Admit), so that
// a peer refused here cannot read the arena's bytes directly either.
func (s *Server) Admit(remote net.Addr) bool {
	if s.allowed(remote) {
		return true
	}
	s.refused.Add(1)
	if s.opt.Registered != nil {
		s.unregistered.Add(1)
	}
	s.refusedLog.log(s.opt.Log, remote, s.opt.Registered != nil)
	return false
}

func (s *Server) allowed(a net.Addr) bool {
	if len(s.opt.Allow) == 0 && s.opt.Registered == nil {
		return true
	}
	var ip netip.Addr
	if ta, ok := a.(*net.TCPAddr); ok {
		ip = ta.AddrPort().Addr().Unmap().WithZone("")
	} else if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		ip = ap.Addr().Unmap().WithZone("")
	} else {
		return false
	}
	if s.opt.Registered != nil && s.opt.Registered(ip) {
		return true
	}
	for _, p := range s.opt.Allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// serveConn answers requests on c until it closes or sends a bad frame.
func (s *Server) serveConn(c net.Conn) {
	var (
		hdr  [4]byte
		body []byte
		out  []byte
		req  Request
		hint Hint
		resp Response
		sc   kvd.Scratch
	)
	for {
		_ = c.SetReadDeadline(time.Now().Add(s.opt.IdleTimeout))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := binary.LittleEndian.Uint32(hdr[:])
		if n > MaxFrame {
			s.opt.Log.Warn().Str("peer", c.RemoteAddr().String()).Uint32("frame_bytes", n).Msg("kvd peer: oversized frame; closing the connection")
			return
		}
		if cap(body) < int(n) {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		s.requests.Add(1)
		if len(body) >= 4 && [4]byte(body[:4]) == hintMagic {
			r := s.serveHint(body, &hint)
			out = appendHintReply(out[:0], r)
			_ = c.SetWriteDeadline(time.Now().Add(s.opt.IdleTimeout))
			if _, err := c.Write(out); err != nil || r.Status == statusBad {
				return
			}
			continue
		}
		resp = Response{Entries: resp.Entries[:0]}
		if err := ParseRequest(body, &req); err != nil {
			resp.Status = statusBad
		} else if len(s.opt.Secret) > 0 && subtle.ConstantTimeCompare(req.Secret, s.opt.Secret) != 1 {
			s.denied.Add(1)
			resp.Status = statusDenied
		} else {
			resp.Region = s.region.Desc()
			for _, k := range req.Keys {
				h := s.store.Get(req.Model, req.Compat, k, &sc)
				e := Entry{}
				if h.Found && h.Arena {
					e = Entry{Found: true, Offset: uint64(h.Offset), Length: uint32(h.Length), Version: h.Version}
					s.located.Add(1)
				}
				resp.Entries = append(resp.Entries, e)
			}
		}
		var err error
		if out, err = AppendResponse(out[:0], &resp); err != nil {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(s.opt.IdleTimeout))
		if _, err := c.Write(out); err != nil || resp.Status == statusBad {
			return
		}
	}
}

// serveHint checks a hint and hands it to the prefetcher.
func (s *Server) serveHint(body []byte, h *Hint) HintReply {
	if err := ParseHint(body, h); err != nil || s.opt.Hint == nil {
		return HintReply{Status: statusBad}
	}
	if len(s.opt.Secret) > 0 && subtle.ConstantTimeCompare(h.Secret, s.opt.Secret) != 1 {
		s.denied.Add(1)
		return HintReply{Status: statusDenied}
	}
	s.hints.Add(1)
	pulled, done := s.opt.Hint(h.Source, h.Model, h.Compat, h.Keys, h.Deadline, h.Wait)
	return HintReply{Status: statusOK, Done: done, Pulled: uint32(pulled)}
}

var (
	mConnsRefused = prometheus.NewDesc("infera_kvd_peer_connections_refused_total",
		"connections to the peer listener closed before any request, by reason (unregistered: the source is neither a registered kvd's host nor in --peer-allow; network: outside --peer-allow)", []string{"reason"}, nil)
	mDenied = prometheus.NewDesc("infera_kvd_peer_requests_denied_total", "peer requests and hints refused for a wrong --peer-secret", nil, nil)
)

// Collector exposes the listener's refusals.
func (s *Server) Collector() prometheus.Collector { return serverCollector{s} }

type serverCollector struct{ s *Server }

func (c serverCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- mConnsRefused
	ch <- mDenied
}

func (c serverCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	ch <- prometheus.MustNewConstMetric(mConnsRefused, prometheus.CounterValue, float64(st.Unregistered), "unregistered")
	ch <- prometheus.MustNewConstMetric(mConnsRefused, prometheus.CounterValue, float64(st.Refused-st.Unregistered), "network")
	ch <- prometheus.MustNewConstMetric(mDenied, prometheus.CounterValue, float64(st.Denied))
}
