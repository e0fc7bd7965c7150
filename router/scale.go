package router

import (
	"context"
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/jsonx"
)

// ScaleAPI reads and resizes the fleet's pools for GET/POST
// /v1/admin/scale (--enable-scaling-api). The kubernetes backend's
// InferaDeployment scaler implements it (discovery/kube.Scaler, wired in
// cmd_serve). Errors carrying an HTTPStatus() int are answered with that
// status and their message; others are 500.
type ScaleAPI interface {
	// ScaleGet returns the GET answer (JSON).
	ScaleGet(ctx context.Context) ([]byte, error)
	// ScalePost applies a POST body and returns the answer (JSON).
	ScalePost(ctx context.Context, body []byte) ([]byte, error)
}

// SetScaleAPI enables GET/POST /v1/admin/scale with api; call it before
// serving. Without it the route answers 403 (disabled).
func (r *Router) SetScaleAPI(api ScaleAPI) { r.scale = api }

// ScaleTimeout bounds one scaling request (a few API server calls).
const ScaleTimeout = 30 * time.Second

// scaleDisabled is the reference's answer when the API is off.
const scaleDisabled = "scaling API disabled; start the server with --enable-scaling-api"

// ServeScale answers GET/POST /v1/admin/scale with the API SetScaleAPI
// installed; without one the API is off (403, as the reference). Answers
// are the reference's: the view as JSON, errors as {"detail": message}.
// Authentication (the admin token) is the caller's: serve's allowed.
func (r *Router) ServeScale(ctx *fasthttp.RequestCtx) {
	api := r.scale
	post := ctx.IsPost()
	if !ctx.IsGet() && !post {
		ctx.Response.Header.Set("Allow", "GET, POST")
		writeDetail(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed")
		r.metrics.request(RouteScale, outcomeMethodNotAllowed).Inc()
		return
	}
	if api == nil {
		writeDetail(ctx, fasthttp.StatusForbidden, scaleDisabled)
		r.metrics.request(RouteScale, outcomeUnauthorized).Inc()
		return
	}
	c, cancel := context.WithTimeout(context.Background(), ScaleTimeout)
	defer cancel()
	var (
		body []byte
		err  error
	)
	if post {
		body, err = api.ScalePost(c, ctx.PostBody())
	} else {
		body, err = api.ScaleGet(c)
	}
	if err != nil {
		status := fasthttp.StatusInternalServerError
		var hs interface{ HTTPStatus() int }
		if errors.As(err, &hs) {
			status = hs.HTTPStatus()
		} else {
			r.log.Warn().Err(err).Bool("post", post).Msg("scaling API")
		}
		writeDetail(ctx, status, err.Error())
		o := outcomeBadRequest
		switch {
		case status == fasthttp.StatusForbidden:
			o = outcomeUnauthorized
		case status == fasthttp.StatusNotFound:
			o = outcomeNotFound
		case status >= 500:
			o = outcomeUpstreamError
		}
		r.metrics.request(RouteScale, o).Inc()
		return
	}
	ctx.SetContentType("application/json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetBody(body)
	r.metrics.request(RouteScale, outcomeOK).Inc()
}

// writeDetail writes FastAPI's error shape, {"detail": message}.
func writeDetail(ctx *fasthttp.RequestCtx, status int, message string) {
	b := append([]byte(`{"detail":`), jsonx.AppendQuoted(nil, message)...)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '}'))
}
