package router

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/openai"
)

// GET /v1/models and /v1/models/{id}, shaped as Infera's Python server
// shapes them (created is the time of the request).

// serveModel answers GET /v1/models/{id}: the model object of a model the
// fleet serves (one /v1/models lists), else 404 in the OpenAI envelope.
func (r *Router) serveModel(ctx *fasthttp.RequestCtx) {
	const rt = RouteModel
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "use GET for "+rt.Path(), openai.TypeInvalidRequest, "method_not_allowed")
		r.metrics.request(rt, outcomeMethodNotAllowed).Inc()
		return
	}
	// The path is decoded: an id with a slash (org/model) arrives whole,
	// escaped as %2F or not.
	id := ctx.Path()[len(modelPrefix):]
	v := r.view.Load()
	if v == nil {
		v = &emptyView
	}
	if c := v.models[string(id)]; c == nil || len(c.Workers) == 0 {
		writeError(ctx, fasthttp.StatusNotFound, "The model `"+clip(id)+"` does not exist.", openai.TypeNotFound, "model_not_found")
		r.metrics.request(rt, outcomeModelNotFound).Inc()
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(appendModel(ctx.Response.Body()[:0], string(id), time.Now()))
	r.metrics.request(rt, outcomeOK).Inc()
}

// appendModels renders GET /v1/models with created set as Infera sets it:
// the time of the request, in Unix seconds.
func appendModels(b []byte, names []string, now time.Time) []byte {
	b = append(b, `{"object":"list","data":[`...)
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendModel(b, name, now)
	}
	return append(b, "]}"...)
}

// appendModel renders one model object, as in /v1/models.
func appendModel(b []byte, name string, now time.Time) []byte {
	b = append(b, `{"id":`...)
	b = openai.AppendQuoted(b, name)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, now.Unix(), 10)
	return append(b, `,"owned_by":"infera"}`...)
}
