package router

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"

	"github.com/infera/infera/openai"
)

// Cache-view errors.
var (
	// ErrUnknownWorker: no worker of that id is attached.
	ErrUnknownWorker = errors.New("router: unknown worker")
	// ErrUnknownRank: the worker has no such data-parallel rank.
	ErrUnknownRank = errors.New("router: unknown data-parallel rank")
)

// CacheView is what a policy knows about one worker's KV cache, for GET
// /v1/admin/cache-view/{worker_id}.
type CacheView struct {
	WorkerID string
	// DPRank is the rank described; AllRanks means the view sums every
	// rank of a data-parallel worker (no ?dp_rank given) and dp_rank is
	// reported as null.
	DPRank   int
	AllRanks bool
	// BlockCount is the number of blocks the router matches against: those
	// its event stream indexed when the worker has one, otherwise its own
	// recorded placements.
	BlockCount int
	// PlacementBlocks counts the router's recorded placements.
	PlacementBlocks int
	// Precise: the worker is routed on a confirmed event stream.
	Precise bool
	// PromptBlocks counts the prompt blocks of the picks of this worker
	// (rank), HitBlocks those it was expected to hold: the predicted hit
	// ratio (GET /v1/admin/fleet).
	PromptBlocks, HitBlocks uint64
}

// CacheViewer is implemented by policies that keep a view of the workers'
// KV caches (kv-aware).
type CacheViewer interface {
	// CacheView describes workerID's cache; hasRank selects one DP rank.
	// Errors: ErrUnknownWorker, ErrUnknownRank.
	CacheView(workerID string, dpRank int, hasRank bool) (CacheView, error)
}

// maxRankQuery bounds ?dp_rank (discovery caps dp_size at 1024).
const maxRankQuery = 1 << 16

// serveCacheView answers GET /v1/admin/cache-view/{worker_id}[?dp_rank=N].
func (r *Router) serveCacheView(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "use GET for "+RouteCacheView.Path(), openai.TypeInvalidRequest, "method_not_allowed")
		r.metrics.request(RouteCacheView, outcomeMethodNotAllowed).Inc()
		return
	}
	id := string(ctx.Path()[len(cacheViewPrefix):])
	rank, hasRank := 0, false
	if q := ctx.QueryArgs().Peek("dp_rank"); q != nil {
		n, err := strconv.Atoi(string(q))
		if err != nil || n < 0 || n > maxRankQuery {
			writeError(ctx, fasthttp.StatusBadRequest, "dp_rank must be a non-negative integer", openai.TypeInvalidRequest, "invalid_dp_rank")
			r.metrics.request(RouteCacheView, outcomeBadRequest).Inc()
			return
		}
		rank, hasRank = n, true
	}
	cv, ok := r.policy.(CacheViewer)
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, "routing policy "+r.policy.Name()+" keeps no cache view", openai.TypeNotFound, "cache_view_unavailable")
		r.metrics.request(RouteCacheView, outcomeNotFound).Inc()
		return
	}
	view, err := cv.CacheView(id, rank, hasRank)
	switch {
	case errors.Is(err, ErrUnknownRank):
		writeError(ctx, fasthttp.StatusNotFound, "worker "+clip([]byte(id))+" has no dp_rank "+strconv.Itoa(rank), openai.TypeNotFound, "dp_rank_not_found")
		r.metrics.request(RouteCacheView, outcomeNotFound).Inc()
		return
	case err != nil:
		writeError(ctx, fasthttp.StatusNotFound, "unknown worker "+clip([]byte(id)), openai.TypeNotFound, "worker_not_found")
		r.metrics.request(RouteCacheView, outcomeNotFound).Inc()
		return
	}
	b := append([]byte(nil), `{"worker_id":`...)
	b = openai.AppendQuoted(b, view.WorkerID)
	b = append(b, `,"dp_rank":`...)
	if view.AllRanks {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, int64(view.DPRank), 10)
	}
	b = append(b, `,"block_count":`...)
	b = strconv.AppendInt(b, int64(view.BlockCount), 10)
	b = append(b, `,"mode":`...)
	if view.Precise {
		b = append(b, `"precise"`...)
	} else {
		b = append(b, `"approximate"`...)
	}
	b = append(b, `,"placement_blocks":`...)
	b = strconv.AppendInt(b, int64(view.PlacementBlocks), 10)
	b = append(b, '}')
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
	r.metrics.request(RouteCacheView, outcomeOK).Inc()
}

// profilePrefix starts the pprof endpoints served with --enable-profiling.
const profilePrefix = "/debug/pprof"

func isProfilePath(path []byte) bool {
	return bytes.HasPrefix(path, []byte(profilePrefix))
}

// serveProfile answers /debug/pprof/* (Go's net/http/pprof handlers, via
// fasthttp's adaptor) on the admin address, behind the admin token when one
// is set. Its requests count under the "other" route.
func (r *Router) serveProfile(ctx *fasthttp.RequestCtx) {
	if r.adminKey.enabled() && !r.authorized(ctx, &r.adminKey, RouteOther) {
		return
	}
	pprofhandler.PprofHandler(ctx)
	r.metrics.request(RouteOther, outcomeOK).Inc()
}
