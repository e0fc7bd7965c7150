package router

import (
	"bytes"
	"errors"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infera/infera/continuation"
	"github.com/infera/infera/discovery"
)

// Stream continuation ("migration", Infera's name for it). A mixed stream
// that breaks after its first event reached the client — its connection
// lost, its engine gone, silent past --stream-idle-timeout, ended without
// its end marker — is continued on another worker of the model, up to
// Config.MigrationLimit times per request, instead of ending with an error
// event. The continuation is one more leg of the request's plan: failover
// (plan.go) runs it, retryable allows it (canContinue), tryContinue begins
// it. The bytes are the continuation package's: the relay asks engines for
// token ids (return_token_ids, where the engine takes it), every event the
// client gets is observed and stripped of those ids (trackedEvent, the
// pump's transform), and Build makes the continuing request — exact
// (prompt ids + output ids on /v1/completions, its chunks reshaped into
// chat chunks for a chat client) or text (the delivered text carried
// over). A stream that cannot be continued (n > 1, tool calls on the text
// path, an unparseable chunk, ...) ends as before, with the error event.

// migration is a streamed request's continuation state (pooled with its
// relay).
type migration struct {
	on      bool    // the stream is tracked and may be continued
	count   int     // continuations so far
	reshape bool    // the leg's completion chunks go to a chat client
	broken  *Worker // the worker whose stream broke last
	drained bool    // it broke with a worker's drain notice (NATS hand-back)
	track   continuation.Tracker
	askBuf  []byte // a leg's body asking for token ids
	scratch []byte // a reshaped event
}

// empty empties m in place, keeping its buffers (relay.reset: once per
// request, so the Tracker is not copied). A field added to
// migration is cleared here too (TestMigrationEmpty). The Tracker is
// written only while on, so a request that was not tracked (every unary
// one) leaves it as the last reset left it and it is not reset again:
// after empty it is always reset, and startMigration takes it as it is.
func (m *migration) empty() {
	askBuf, scratch := m.askBuf[:0], m.scratch[:0]
	if m.on {
		m.track.Reset(false)
	}
	m.on, m.count, m.reshape, m.broken, m.drained = false, 0, false, nil, false
	m.askBuf, m.scratch = askBuf, scratch
}

// Reasons of infera_migrations_total and infera_migrations_failed_total
// (Infera's label values).
const (
	migrateBroken   = iota // stream_broken
	migrateDraining        // worker_draining
	numMigrateReasons
)

const (
	migrateFailNoCandidate = iota // no_candidate
	migrateFailNoFirstByte        // no_first_byte: no continuation answered with a stream
	migrateFailLimit              // limit: --migration-limit reached
	migrateFailPoisoned           // poisoned: the stream cannot be continued
	numMigrateFails
)

// migrationMetrics are the continuation series, resolved per label value.
type migrationMetrics struct {
	migrations [numMigrateReasons]prometheus.Counter
	failed     [numMigrateFails]prometheus.Counter
}

func newMigrationMetrics(reg *prometheus.Registry) *migrationMetrics {
	total := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_migrations_total",
		Help: "Broken streams continued on another worker, by why they broke (stream_broken, worker_draining).",
	}, []string{"reason"})
	failed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infera_migrations_failed_total",
		Help: "Broken streams that could not be continued, by reason (no_candidate, no_first_byte, limit, poisoned).",
	}, []string{"reason"})
	reg.MustRegister(total, failed)
	m := &migrationMetrics{}
	for i, l := range [...]string{"stream_broken", "worker_draining"} {
		m.migrations[i] = total.WithLabelValues(l)
	}
	for i, l := range [...]string{"no_candidate", "no_first_byte", "limit", "poisoned"} {
		m.failed[i] = failed.WithLabelValues(l)
	}
	return m
}

// startMigration decides, at the request's entry, whether its stream is
// tracked for continuation: a stream of a generating route, a limit above
// 0, and a request that may ever be continued (not n > 1 or best_of > 1).
func (rel *relay) startMigration() {
	if rel.r.cfg.MigrationLimit <= 0 || !rel.scan.Stream || !rel.route.generates() {
		return
	}
	if !continuation.Continuable(rel.scan.N, rel.scan.BestOf) {
		return
	}
	rel.mig.on = true // the Tracker is reset already (empty)
}

// engineOf is a worker's engine as far as token ids go.
func engineOf(rec *discovery.Record) continuation.Engine {
	if rec == nil {
		return continuation.EngineOther
	}
	switch rec.Engine {
	case discovery.EngineVLLM:
		return continuation.EngineVLLM
	case discovery.EngineSGLang:
		return continuation.EngineSGLang
	}
	return continuation.EngineOther
}

// askIDs returns body asking a's worker for token ids, when the stream is
// tracked and the engine takes the field on this route; else body.
func (rel *relay) askIDs(a *attempt, body []byte) []byte {
	if !rel.asksIDs(a) {
		return body
	}
	out, err := continuation.AskIDs(rel.mig.askBuf[:0], body)
	rel.mig.askBuf = out
	if err != nil {
		return body
	}
	rel.mig.track.Strip = true // the router asked: the client must not see them
	return out
}

// askIDsAt is askIDs for a request that writes its body itself
// (ownRequest): where in body the field goes, and the field; an empty
// field when the body goes as it is.
func (rel *relay) askIDsAt(a *attempt, body []byte) (int, string) {
	if !rel.asksIDs(a) {
		return 0, ""
	}
	at, field, err := continuation.AskIDsAt(body)
	if err != nil {
		return 0, ""
	}
	rel.mig.track.Strip = true // the router asked: the client must not see them
	return at, field
}

// asksIDs: a's request is to ask its worker for the tokens' ids.
func (rel *relay) asksIDs(a *attempt) bool {
	// A unary request is never tracked: scan.Stream spares it a read of
	// the migration (another cache line).
	if !rel.scan.Stream || !rel.mig.on || !continuation.AsksIDs(engineOf(a.ticket.Worker.Record()), rel.route != RouteCompletions) {
		return false
	}
	// A client that asked for them itself gets them: they are not stripped.
	return !rel.scan.HasReturnTokenIDs
}

// trackedEvent is the pump's transform of a tracked stream: the event is
// observed (text and ids remembered, ids stripped), reshaped into a chat
// chunk when a completion continuation feeds a chat client, then handed
// to the route dialect's own translation.
func (rel *relay) trackedEvent(dst, ev []byte) []byte {
	m := rel.mig
	if rel.trackedPlain() {
		return m.track.AppendEvent(dst, ev) // the common case: one copy
	}
	ev = m.track.ObserveEvent(ev)
	if m.reshape {
		if data, ok := eventData(ev); ok && !bytes.Equal(data, []byte("[DONE]")) {
			s := append(m.scratch[:0], "data: "...)
			s = continuation.ReshapeChat(s, data, &m.track)
			s = append(s, "\n\n"...)
			m.scratch = s
			ev = s
		}
	}
	switch {
	case rel.dialect.stream:
		return rel.xlate.Event(dst, ev)
	case rel.dialect.event != nil:
		return rel.dialect.event(dst, ev)
	}
	return append(dst, ev...)
}

// trackedPlain: the tracker's copy of an event is what the client gets
// (no reshaping, no dialect translation after it).
func (rel *relay) trackedPlain() bool {
	return !rel.mig.reshape && !rel.dialect.stream && rel.dialect.event == nil
}

// trackLead is the pump's lead for a tracked stream (see eventPump.lead):
// the Tracker finds a steady event's end by matching it, and its copy
// (never longer than the event) is written over the bytes it was read
// from. nil when the copy goes on to a reshaping or a dialect (an
// untyped nil: a nil *Tracker in the interface would be a lead).
func (rel *relay) trackLead() leader {
	if !rel.trackedPlain() {
		return nil
	}
	return &rel.mig.track
}

// eventData returns the payload of an event's data line.
func eventData(ev []byte) ([]byte, bool) {
	i := bytes.Index(ev, []byte("data:"))
	if i < 0 || (i > 0 && ev[i-1] != '\n') {
		return nil, false
	}
	start := i + len("data:")
	if start < len(ev) && ev[start] == ' ' {
		start++
	}
	end := start
	for end < len(ev) && ev[end] != '\n' && ev[end] != '\r' {
		end++
	}
	return ev[start:end], true
}

// streamComplete reports whether a stream that reached its clean end
// (EOF) is complete: a tracked one when it carried its [DONE] or a finish
// reason; one that is not tracked, or cannot be continued anyway, is taken
// as it ends, as before continuation existed.
func (rel *relay) streamComplete() bool {
	t := &rel.mig.track
	return !rel.mig.on || t.Done || t.Finished || t.Poisoned != continuation.PoisonNone
}

// continuing reports whether a failed stream can only go on as a
// continuation: its first event reached the client, or it is a
// disaggregated stream whose status line went out (its decode leg is
// paired with one prefill: another pair cannot take its place, a
// continuation of nothing delivered yet can).
func (rel *relay) continuing() bool {
	return rel.firstByte || (rel.pd != nil && rel.streaming)
}

// canContinue is retryable's rule once a stream can only be continued:
// a tracked stream, not poisoned, under the limit, with time left and an
// untried worker to continue on (continuationPool).
func (rel *relay) canContinue() bool {
	m := rel.mig
	if !m.on || m.count >= rel.r.cfg.MigrationLimit || m.track.Poisoned != continuation.PoisonNone {
		return false
	}
	pool, _ := rel.continuationPool()
	return slices.ContainsFunc(pool, rel.untried)
}

// continuationPool is where a broken stream continues: the model's mixed
// workers; for a disaggregated stream without any, its decode pool when
// the PD protocol's decode engines compute a request without a hand-off
// themselves (vLLM's connectors and ATOM do; SGLang's decode-mode engine
// refuses a request without its bootstrap room). decode says which.
func (rel *relay) continuationPool() (pool []*Worker, decode bool) {
	c := rel.model
	if rel.pd == nil || len(c.Workers) > 0 {
		return c.Workers, false
	}
	if rel.pd.proto != nil && rel.pd.proto.name == discovery.ProtocolSGLangBootstrap {
		return nil, false
	}
	return c.Decode, true
}

// migrationFailed counts a broken tracked stream that ends with the error
// event, by the reason it could not be continued.
func (rel *relay) migrationFailed() {
	m := rel.mig
	if !m.on {
		return
	}
	why := migrateFailNoCandidate
	switch {
	case m.track.Poisoned != continuation.PoisonNone:
		why = migrateFailPoisoned
	case m.count >= rel.r.cfg.MigrationLimit:
		why = migrateFailLimit
	default:
		if pool, _ := rel.continuationPool(); m.count > 0 && slices.ContainsFunc(pool, rel.untried) {
			why = migrateFailNoFirstByte
		}
	}
	rel.r.metrics.mig.failed[why].Inc()
}

// errNotContinuable: a continuation could not be built (the stream is
// poisoned or its request unreadable).
var errNotContinuable = errors.New("router: stream cannot be continued")

// tryContinue runs a continuation leg: another worker, the continuing
// request, and its stream attached in place of the broken one (settled)
// once it answers with an event stream.
func (rel *relay) tryContinue() (bool, error) {
	a := &rel.att
	broken := rel.mig.broken
	begin := rel.begin
	if _, decode := rel.continuationPool(); decode {
		begin = rel.beginLeg // the decode pool (prefill false)
	}
	if err := begin(a, false); err != nil {
		return false, errNoRetry
	}
	rec := a.ticket.Worker.Record()
	var c continuation.Continuation
	var err error
	if rel.firstByte {
		c, err = continuation.Build(rel.body, &rel.mig.track, continuation.Options{
			Chat:   rel.route != RouteCompletions,
			Engine: engineOf(rec),
		})
	} else {
		// Nothing reached the client yet (a disaggregated stream broken
		// before its first event): the client's own request, as a mixed
		// attempt sends it (nil body: hints and the ids asked again).
		c = continuation.Continuation{}
	}
	if err != nil {
		rel.endAttempt(a, 0, nil, verdictNeutral)
		if rel.mig.track.Poisoned == continuation.PoisonNone {
			rel.mig.track.Poisoned = continuation.PoisonUnparseable
		}
		return false, errNotContinuable
	}
	m := rel.mig
	m.count++
	m.reshape = c.Reshape
	a.body = c.Body
	a.exact = c.Exact
	why := migrateBroken
	if rel.mig.drained || broken != nil && broken.Record().Status == discovery.StatusDraining {
		why = migrateDraining
	}
	rel.r.metrics.mig.migrations[why].Inc()
	ev := rel.r.log.Info().Bytes("request_id", rel.id).Str("worker_id", a.ticket.Worker.id).Bool("exact", c.Exact).
		Int("produced", c.Produced).Int("continuation", m.count)
	if broken != nil {
		ev = ev.Str("broken_worker_id", broken.id)
	}
	ev.Msg("continuing a broken stream on another worker")
	rel.pump.n, rel.pump.midEvent = 0, false
	resp, err := rel.send(a)
	if err != nil {
		a.fail(a.classify(err), err)
		rel.endAttempt(a, 0, err, verdictFault)
		return false, err
	}
	return rel.takeStream(a, resp)
}
