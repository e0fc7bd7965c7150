package router_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery/kube"
	"github.com/infera/infera/discovery/kube/kubetest"
	"github.com/infera/infera/internal/servetest"
	"github.com/infera/infera/lifecycle"
	"github.com/infera/infera/router"
)

const scaleObjects = `
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: demo}
spec:
  services:
    prefill: {componentType: worker, role: prefill, replicas: 1}
    decode: {componentType: worker, role: decode, replicas: 1}
---
apiVersion: v1
kind: Pod
metadata:
  name: router-0
  labels: {infera.amd.com/deployment: demo}
spec: {containers: [{name: s, image: infera}]}
---
apiVersion: v1
kind: Pod
metadata: {name: plain}
spec: {containers: [{name: s, image: infera}]}
`

// GET/POST /v1/admin/scale over HTTP with the kubernetes scaler against a
// real API server and the shipped CRD: the reference's statuses and
// {"detail": ...} bodies, the view, and the patched resource.
func TestScaleEndpoint(t *testing.T) {
	srv := kubetest.Start(t)
	cli, err := kube.NewClient(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cli.Close)
	crd, err := os.ReadFile("../deploy/kubernetes/crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	kubetest.Apply(t, cli, crd)
	kubetest.Apply(t, cli, []byte(scaleObjects))

	serveScale := func(api router.ScaleAPI) string {
		r, err := router.New(router.DefaultConfig(), router.RoundRobin{}, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		r.SetScaleAPI(api)
		return "http://" + servetest.Loopback(t, "scale", func(ctx context.Context, ln net.Listener) error {
			return lifecycle.Serve(ctx, &fasthttp.Server{Handler: r.Handle}, ln, lifecycle.Options{Grace: time.Second})
		})
	}
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	call := func(base, method, body string, status int, want string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, base+"/v1/admin/scale", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != status || string(b) != want || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s %s: %d %s %q\nwant %d %s", method, body, resp.StatusCode, resp.Header.Get("Content-Type"), string(b), status, want)
		}
	}

	off := serveScale(nil)
	call(off, http.MethodGet, "", 403, `{"detail":"scaling API disabled; start the server with --enable-scaling-api"}`)
	call(off, http.MethodPost, `{"services":{"decode":2}}`, 403, `{"detail":"scaling API disabled; start the server with --enable-scaling-api"}`)

	plain := serveScale(kube.NewScaler(cli, "default", "plain", testLog(t)))
	call(plain, http.MethodGet, "", 409, `{"detail":"this router was not created by the operator (no infera.amd.com/deployment label), so there is no deployment to scale"}`)

	on := serveScale(kube.NewScaler(cli, "default", "router-0", testLog(t)))
	call(on, http.MethodPut, "", 405, `{"detail":"Method Not Allowed"}`)
	call(on, http.MethodPost, `{`, 400, `{"detail":"body must be JSON"}`)
	call(on, http.MethodPost, `{"services":3}`, 400, `{"detail":"body must be {\"services\": {\"<name>\": {\"replicas\": N}}}"}`)
	call(on, http.MethodPost, `{"services":{"prefill":2,"decode":0}}`, 400, `{"detail":"decode: refusing to scale to 0. A pool at zero stops serving, `+
		`and in a PD deployment an empty prefill or decode pool fails every request. Edit the InferaDeployment directly if that is the intent."}`)
	view := func(prefill, decode string) string {
		return `{"deployment":"demo","namespace":"default","state":"unknown","services":{` +
			`"decode":{"role":"decode","replicas":` + decode + `,"current_replicas":0,"ready_replicas":0,"nodes_per_replica":1},` +
			`"prefill":{"role":"prefill","replicas":` + prefill + `,"current_replicas":0,"ready_replicas":0,"nodes_per_replica":1}}}`
	}
	call(on, http.MethodGet, "", 200, view("1", "1"))
	call(on, http.MethodPost, `{"services":{"prefill":{"replicas":2},"decode":3}}`, 200, view("2", "3"))
	call(on, http.MethodGet, "", 200, view("2", "3"))
}
