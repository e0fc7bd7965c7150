package router

import "strconv"

// Route identifies an endpoint of the router.
type Route uint8

// Routes. The proxied ones come first so that they index per-worker URI
// arrays.
const (
	RouteChatCompletions Route = iota
	RouteCompletions
	RouteMessages   // POST /v1/messages (Anthropic), to the workers' chat API
	RouteEmbeddings // POST /v1/embeddings, routed by load
	RouteResponses  // POST /v1/responses, routed by load
	RouteCountTokens
	RouteModels
	RouteModel      // GET /v1/models/{id}
	RouteTokenize   // POST /tokenize (vLLM's), by the router's tokenizer
	RouteDetokenize // POST /detokenize (vLLM's), by the router's tokenizer
	RouteWorkers
	RouteHealth
	RouteReady // GET /ready: 200 only with a routable worker
	RouteMetrics
	RouteCacheView // GET /v1/admin/cache-view/{worker_id}
	RoutePrewarm   // POST /v1/cache/prewarm: a prefetch_hint to kvd (prewarm.go)
	RouteFleet     // GET /v1/admin/fleet: the fleet snapshot, or its SSE stream (fleetsnap.go)
	RouteDashboard // GET /dashboard: the live fleet page (webui)
	RouteScale     // GET/POST /v1/admin/scale: the InferaDeployment's pool sizes (scale.go)
	RouteOther
	numRoutes
)

// numProxyRoutes counts the routes forwarded to workers.
const numProxyRoutes = RouteResponses + 1

var routePaths = [numRoutes]string{
	RouteChatCompletions: "/v1/chat/completions",
	RouteCompletions:     "/v1/completions",
	RouteMessages:        "/v1/messages",
	RouteEmbeddings:      "/v1/embeddings",
	RouteResponses:       "/v1/responses",
	RouteCountTokens:     "/v1/messages/count_tokens",
	RouteModels:          "/v1/models",
	RouteModel:           modelPrefix + "{id}",
	RouteTokenize:        "/tokenize",
	RouteDetokenize:      "/detokenize",
	RouteWorkers:         "/v1/workers",
	RouteHealth:          "/health",
	RouteReady:           "/ready",
	RouteMetrics:         "/metrics",
	RouteCacheView:       cacheViewPrefix + "{worker_id}",
	RoutePrewarm:         "/v1/cache/prewarm",
	RouteFleet:           "/v1/admin/fleet",
	RouteDashboard:       "/dashboard",
	RouteScale:           "/v1/admin/scale",
	RouteOther:           "",
}

// modelPrefix starts GET /v1/models/{id}; the model id (which may hold
// slashes) follows.
const modelPrefix = "/v1/models/"

// cacheViewPrefix starts the admin cache-view path; the worker id follows.
const cacheViewPrefix = "/v1/admin/cache-view/"

var routeLabels = [numRoutes]string{
	RouteChatCompletions: "chat_completions",
	RouteCompletions:     "completions",
	RouteMessages:        "messages",
	RouteEmbeddings:      "embeddings",
	RouteResponses:       "responses",
	RouteCountTokens:     "messages_count_tokens",
	RouteModels:          "models",
	RouteModel:           "model",
	RouteTokenize:        "tokenize",
	RouteDetokenize:      "detokenize",
	RouteWorkers:         "workers",
	RouteHealth:          "health",
	RouteReady:           "ready",
	RouteMetrics:         "metrics",
	RouteCacheView:       "cache_view",
	RoutePrewarm:         "cache_prewarm",
	RouteFleet:           "fleet",
	RouteDashboard:       "dashboard",
	RouteScale:           "scale",
	RouteOther:           "other",
}

// Path returns the URL path of the route ("" for RouteOther).
func (rt Route) Path() string {
	if rt >= numRoutes {
		return ""
	}
	return routePaths[rt]
}

// upstreamPath is the path a proxied route has on its workers: the
// Anthropic route is served by their chat API.
func (rt Route) upstreamPath() string {
	if rt == RouteMessages {
		return routePaths[RouteChatCompletions]
	}
	return rt.Path()
}

// String returns the route's metrics label.
func (rt Route) String() string {
	if rt >= numRoutes {
		return "other"
	}
	return routeLabels[rt]
}

func routeOf(path []byte) Route {
	switch string(path) {
	case "/v1/chat/completions":
		return RouteChatCompletions
	case "/v1/completions":
		return RouteCompletions
	case "/v1/messages":
		return RouteMessages
	case "/v1/embeddings":
		return RouteEmbeddings
	case "/v1/responses":
		return RouteResponses
	case "/v1/messages/count_tokens":
		return RouteCountTokens
	case "/v1/models":
		return RouteModels
	case "/tokenize":
		return RouteTokenize
	case "/detokenize":
		return RouteDetokenize
	case "/v1/workers":
		return RouteWorkers
	case "/health":
		return RouteHealth
	case "/ready":
		return RouteReady
	case "/metrics":
		return RouteMetrics
	case "/v1/cache/prewarm":
		return RoutePrewarm
	case "/v1/admin/fleet":
		return RouteFleet
	case "/dashboard":
		return RouteDashboard
	case "/v1/admin/scale":
		return RouteScale
	}
	if len(path) > len(modelPrefix) && string(path[:len(modelPrefix)]) == modelPrefix {
		return RouteModel
	}
	if len(path) > len(cacheViewPrefix) && string(path[:len(cacheViewPrefix)]) == cacheViewPrefix {
		return RouteCacheView
	}
	return RouteOther
}

// outcome classifies how a request ended, for metrics.
type outcome uint8

const (
	outcomeOK               outcome = iota // 2xx relayed or served
	outcomeUpstreamStatus                  // the worker answered with a non-2xx status, relayed
	outcomeBadRequest                      // unreadable request or invalid JSON/fields
	outcomeTooLarge                        // body over --max-body-bytes
	outcomeMethodNotAllowed                // wrong HTTP method
	outcomeNotFound                        // unknown path
	outcomeModelNotFound                   // no worker in the fleet serves the model
	outcomeNoWorker                        // the model's workers are all draining or unusable
	outcomeNotReady                        // no fleet snapshot yet
	outcomeUpstreamError                   // the worker failed before any byte reached the client
	outcomeStreamError                     // the worker failed in the middle of a stream
	outcomeClientGone                      // the client went away mid-response
	outcomeUnauthorized                    // missing or wrong API key / admin token
	outcomeTooManyRequests                 // every worker full for the whole queue timeout
	outcomeBodyBudget                      // the body did not fit --body-budget-bytes
	numOutcomes
)

var outcomeLabels = [numOutcomes]string{
	outcomeOK:               "ok",
	outcomeUpstreamStatus:   "upstream_status",
	outcomeBadRequest:       "bad_request",
	outcomeTooLarge:         "too_large",
	outcomeMethodNotAllowed: "method_not_allowed",
	outcomeNotFound:         "not_found",
	outcomeModelNotFound:    "model_not_found",
	outcomeNoWorker:         "no_worker",
	outcomeNotReady:         "not_ready",
	outcomeUpstreamError:    "upstream_error",
	outcomeStreamError:      "stream_error",
	outcomeClientGone:       "client_gone",
	outcomeUnauthorized:     "unauthorized",
	outcomeTooManyRequests:  "too_many_requests",
	outcomeBodyBudget:       "body_budget",
}

func (o outcome) String() string { return outcomeLabels[o] }

// admin reports whether rt is an admin or fleet endpoint: served on
// --admin-listen when there is one, behind --admin-token when set.
func (rt Route) admin() bool {
	return rt == RouteWorkers || rt == RouteMetrics || rt == RouteCacheView || rt == RouteFleet || rt == RouteDashboard || rt == RouteScale
}

// generates reports whether the route's workers generate tokens: their
// requests carry cache hints and are routed by the policy. The others
// (embeddings, responses) go to the least-loaded worker as they are.
func (rt Route) generates() bool {
	return rt == RouteChatCompletions || rt == RouteCompletions || rt == RouteMessages
}

func itoa(n int) string { return strconv.Itoa(n) }

// routePolicy is the policy that picks workers for route rt: the router's
// own for the generating routes; least load for embeddings and responses,
// whose prompts no kv cache is kept for.
func (r *Router) routePolicy(rt Route) Policy {
	if rt.generates() {
		return r.policy
	}
	return LeastLoad{}
}
