package router

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/openai"
)

// Policy errors.
var (
	// ErrUnknownPolicy: no policy of that name is registered.
	ErrUnknownPolicy = errors.New("router: unknown routing policy")
	// ErrDuplicatePolicy: a name was registered twice.
	ErrDuplicatePolicy = errors.New("router: routing policy already registered")
	// ErrNoWorker: a policy was asked to pick from no candidates.
	ErrNoWorker = errors.New("router: no worker available")
)

// PickInput is what a policy may look at for one request. Everything in it
// is valid only during Pick: Body and the spans of Request alias the
// client's request buffer.
type PickInput struct {
	Route     Route
	Body      []byte          // the request body, forwarded unchanged
	Request   *openai.Request // the scanned fields; its spans index Body
	RequestID []byte
}

// Candidates are the active workers serving one model, sorted by worker id.
// A Candidates value belongs to one fleet view and is never modified.
type Candidates struct {
	Model   string
	Workers []*Worker
	// Prefill and Decode are the model's active prefill and decode
	// workers (disaggregated serving, pd.go); Workers holds the mixed ones.
	Prefill, Decode []*Worker
	cursor          *atomic.Uint64 // per model, kept across fleet views
	// The pools' own cursors, so that the two picks of a pair do not
	// share one rotation.
	prefillCursor, decodeCursor *atomic.Uint64
}

// Next advances and returns the model's rotation cursor, which policies use
// to spread picks (round-robin, and tie-breaking in least-load). It is
// shared by all requests for the model and survives fleet updates.
func (c *Candidates) Next() uint64 { return c.cursor.Add(1) - 1 }

// Ticket is a policy's pick. The router holds it for the life of the request
// and hands it back to Release when the request ends, successfully or not.
type Ticket struct {
	Worker *Worker
	// State is private to the policy (for example the prompt blocks a
	// kv-aware policy charged to the worker); nil for stateless policies.
	State any
	// PinRank asks the worker's engine to run the request on data-parallel
	// rank DPRank: the router sends it as X-Data-Parallel-Rank. Without it
	// the engine balances its ranks itself.
	PinRank bool
	DPRank  int
}

// Result describes how a request ended, for Release.
type Result struct {
	Status   int           // HTTP status relayed to the client; 0 when none came from the worker
	Err      error         // why the upstream exchange failed, or nil
	Duration time.Duration // from the request's arrival to its end
}

// Policy picks the worker for a request. Pick runs on the request path
// concurrently for many requests, so it must not block; Release is called
// exactly once per successful Pick.
//
// The router counts in-flight requests per worker itself (Worker.InFlight),
// around Pick and Release, so policies need no bookkeeping of their own for
// that.
type Policy interface {
	Name() string
	Pick(in *PickInput, c *Candidates) (Ticket, error)
	Release(t Ticket, res Result)
}

// FleetAware is implemented by policies that keep per-worker state. Attach
// is called for each worker before it becomes visible to Pick (the policy
// may set Worker.PolicyState then); Detach after it left the fleet (requests
// already routed to it may still be running). Both are called from one
// goroutine at a time.
type FleetAware interface {
	Attach(w *Worker)
	Detach(w *Worker)
}

// RecordAware is implemented by FleetAware policies that follow changes of
// an attached worker's record (same worker_id and URL: a new status, event
// endpoint, block size or DP layout). Update is called for every worker kept
// across a fleet snapshot, after its new record is stored and before the new
// view is visible, from the goroutine that calls Attach and Detach.
type RecordAware interface {
	Update(w *Worker)
}

// Factory builds a policy. Factories that need configuration capture it in a
// closure where they are registered.
type Factory func() (Policy, error)

// Registry maps policy names to factories. It is filled explicitly by main
// (RegisterBuiltins plus any others), never by init functions.
type Registry struct {
	mu        sync.Mutex
	factories map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{factories: make(map[string]Factory)}
}

// Register adds a policy factory under name.
func (r *Registry) Register(name string, f Factory) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.factories[name]; ok {
		return fmt.Errorf("register %q: %w", name, ErrDuplicatePolicy)
	}
	r.factories[name] = f
	return nil
}

// Names returns the registered names, sorted.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// New builds the named policy.
func (r *Registry) New(name string) (Policy, error) {
	r.mu.Lock()
	f, ok := r.factories[name]
	r.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("policy %q: %w", name, ErrUnknownPolicy)
	}
	p, err := f()
	if err != nil {
		return nil, fmt.Errorf("build policy %q: %w", name, err)
	}
	return p, nil
}

// Names of the built-in policies.
const (
	PolicyRoundRobin = "round-robin"
	PolicyLeastLoad  = "least-load"
	PolicyKVAware    = "kv-aware"
)

// RegisterBuiltins registers round-robin and least-load.
func RegisterBuiltins(r *Registry) error {
	if err := r.Register(PolicyRoundRobin, func() (Policy, error) { return RoundRobin{}, nil }); err != nil {
		return err
	}
	return r.Register(PolicyLeastLoad, func() (Policy, error) { return LeastLoad{}, nil })
}

// RoundRobin cycles through a model's active workers; a rank-multiplexed
// worker takes dp_size turns, pinned to its ranks 0, 1, … (dprank.go).
type RoundRobin struct{}

// Name implements Policy.
func (RoundRobin) Name() string { return PolicyRoundRobin }

// Pick implements Policy.
func (RoundRobin) Pick(_ *PickInput, c *Candidates) (Ticket, error) {
	if len(c.Workers) == 0 {
		return Ticket{}, ErrNoWorker
	}
	n := uint64(totalTargets(c.Workers))
	return pickTarget(c.Workers, int(c.Next()%n)), nil
}

// Release implements Policy.
func (RoundRobin) Release(Ticket, Result) {}

// LeastLoad picks the worker with the fewest in-flight requests. The scan
// starts at the model's rotating cursor and keeps the first minimum, so
// equally loaded workers are taken in turn instead of always the first one.
// A rank-multiplexed worker's requests are pinned to its ranks in turn.
type LeastLoad struct{}

// Name implements Policy.
func (LeastLoad) Name() string { return PolicyLeastLoad }

// Pick implements Policy.
func (LeastLoad) Pick(_ *PickInput, c *Candidates) (Ticket, error) {
	n := len(c.Workers)
	if n == 0 {
		return Ticket{}, ErrNoWorker
	}
	start := int(c.Next() % uint64(n))
	best := c.Workers[start]
	bestLoad := best.InFlight()
	for i := 1; i < n && bestLoad > 0; i++ {
		w := c.Workers[(start+i)%n]
		if l := w.InFlight(); l < bestLoad {
			best, bestLoad = w, l
		}
	}
	t := Ticket{Worker: best}
	pinNextRank(&t)
	return t, nil
}

// Release implements Policy.
func (LeastLoad) Release(Ticket, Result) {}
