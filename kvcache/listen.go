package kvcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/infera/infera/zmtp"
)

// The central event listener (`infera serve --kv-events-listen`): one SUB
// socket the router binds and every engine's publisher connects to (vLLM's
// publisher connects when its endpoint names no wildcard host), so that a
// fleet needs one firewall opening and publishers that only connect work.
// The worker gives its engine the topic TopicPrefix + its worker id; the
// listener routes each message by its topic frame to that worker's stream
// (Source.Listen). Messages on a topic no stream follows are dropped.

// TopicPrefix starts the topic of a publisher that connects to the router's
// listener; the worker id follows it.
const TopicPrefix = "kv@"

// WorkerTopic is the topic a worker's engine publishes under when it connects
// to a router's listener.
func WorkerTopic(workerID string) string { return TopicPrefix + workerID }

// listenQueue is how many messages wait for one stream before the
// connection delivering them blocks (TCP back-pressure on the publisher).
const listenQueue = 1024

// listenMsg is one live message handed from a listener connection to the
// stream of its topic; conn tells connections apart (a new one may mean a
// restarted engine).
type listenMsg struct {
	conn    uint64
	seq     uint64
	payload []byte
}

// listener is the bound SUB socket and its connections.
type listener struct {
	ln   net.Listener
	addr string
	wg   sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	nextID uint64
	closed bool
}

// Listen binds endpoint (tcp://HOST:PORT; port 0 picks one) as the SUB socket
// publishers connect to and returns the bound endpoint. One Subscriber
// listens at most once; Close stops it.
func (s *Subscriber) Listen(endpoint string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", ErrClosed
	}
	if s.lis != nil {
		return "", fmt.Errorf("%w: already listening on %s", ErrInvalidConfig, s.lis.addr)
	}
	ln, err := zmtp.Listen(s.ctx, endpoint)
	if err != nil {
		return "", fmt.Errorf("kv events listen %s: %w", endpoint, err)
	}
	l := &listener{ln: ln, addr: zmtp.BoundEndpoint(endpoint, ln), conns: make(map[net.Conn]struct{})}
	s.lis = l
	l.wg.Go(func() { s.accept(l) })
	s.log.Info().Str("endpoint", l.addr).Msg("kv events listener bound")
	return l.addr, nil
}

// close stops accepting, closes every connection and waits.
func (l *listener) close() {
	l.ln.Close()
	l.mu.Lock()
	l.closed = true
	for nc := range l.conns {
		nc.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (s *Subscriber) accept(l *listener) {
	var delay time.Duration
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), 100*time.Millisecond)
			s.log.Warn().Err(err).Dur("retry_in", delay).Msg("kv events listener accept failed")
			time.Sleep(delay)
			continue
		}
		delay = 0
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			nc.Close()
			continue
		}
		l.conns[nc] = struct{}{}
		l.nextID++
		id := l.nextID
		l.mu.Unlock()
		l.wg.Go(func() {
			defer func() {
				nc.Close()
				l.mu.Lock()
				delete(l.conns, nc)
				l.mu.Unlock()
			}()
			s.serveListenConn(nc, id)
		})
	}
}

// serveListenConn subscribes to every topic on one publisher connection and
// hands its messages to the streams of their topics.
func (s *Subscriber) serveListenConn(nc net.Conn, id uint64) {
	peer := nc.RemoteAddr().String()
	zc, err := zmtp.Handshake(s.ctx, nc, zmq4.Sub, true, s.cfg.DialTimeout, uint64(s.cfg.MaxMessageBytes))
	if err != nil {
		s.log.Debug().Err(err).Str("peer", peer).Msg("kv events publisher rejected")
		return
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return
	}
	if err := zc.SendMsg(zmq4.NewMsg([]byte{1})); err != nil {
		return
	}
	s.log.Debug().Str("peer", peer).Msg("kv events publisher connected")
	var unknownLogged bool
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type != zmq4.UsrMsg {
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			continue
		}
		worker, ok := strings.CutPrefix(string(msg.Frames[0]), TopicPrefix)
		st := s.listenStream(worker)
		if !ok || st == nil {
			if !unknownLogged {
				unknownLogged = true
				s.log.Warn().Str("peer", peer).Str("topic", string(msg.Frames[0])).
					Msg("kv events on a topic no worker of the fleet publishes under; dropped (logged once per connection)")
			}
			continue
		}
		select {
		case st.in <- listenMsg{conn: id, seq: zmtp.Seq(msg.Frames[1]), payload: msg.Frames[2]}:
		case <-st.done:
		case <-s.ctx.Done():
			return
		}
	}
}

// listenStream returns the listener-fed stream of worker (rank 0), or nil.
func (s *Subscriber) listenStream(worker string) *stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.subs[Key{Worker: worker}]
	if !ok || !st.src.Listen {
		return nil
	}
	return st
}

// listenSession follows a listener-fed stream: messages come from whichever
// connection carries the worker's topic. A message from a connection other
// than the last one is treated as a new connection's first (a restarted
// engine starts below what was applied).
func (st *stream) listenSession(ctx context.Context) {
	if st.src.ReplayEndpoint != "" {
		if err := st.replay(ctx); err != nil {
			st.replayFailed(err)
		}
	}
	var conn uint64
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-st.in:
			if m.conn != conn {
				if conn != 0 || st.next > 0 {
					st.log.Info().Uint64("seq", m.seq).Msg("kv events publisher connected to the listener")
				}
				st.connected.Store(true)
				st.connects.Add(1)
				if m.seq < st.next && st.isSynced() {
					st.restarted(m.seq)
				}
				conn = m.conn
			}
			st.handle(ctx, m.seq, m.payload, true)
		}
	}
}
