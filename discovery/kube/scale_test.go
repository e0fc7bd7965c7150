package kube_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery/kube"
	"github.com/infera/infera/discovery/kube/kubetest"
)

const scaleFixture = `
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata:
  name: demo
spec:
  services:
    server: {componentType: server}
    prefill: {componentType: worker, role: prefill, replicas: 1}
    decode: {componentType: worker, role: decode, replicas: 2, numberOfNodes: 2}
---
apiVersion: v1
kind: Pod
metadata:
  name: router-0
  labels: {infera.amd.com/deployment: demo, infera.amd.com/service: server}
spec: {containers: [{name: s, image: infera}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: router-ghost
  labels: {infera.amd.com/deployment: ghost}
spec: {containers: [{name: s, image: infera}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: plain
spec: {containers: [{name: s, image: infera}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: decode-1
  labels: {infera.amd.com/deployment: demo, infera.amd.com/service: decode}
spec: {containers: [{name: w, image: infera}]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pods-only}
rules:
  - {apiGroups: [""], resources: [pods], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-pods}
subjects: [{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: Role, name: pods-only, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: read-only}
rules:
  - {apiGroups: [""], resources: [pods], verbs: [get, list]}
  - {apiGroups: [infera.amd.com], resources: [inferadeployments], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: carol-read}
subjects: [{kind: User, name: carol, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: Role, name: read-only, apiGroup: rbac.authorization.k8s.io}
`

// The scaler's answers against a real API server with the shipped CRD and
// RBAC authorization: each status code and message of the reference's
// scaling API, the view's JSON, and an all-or-nothing merge patch.
func TestScalingAPIAgainstAPIServer(t *testing.T) {
	srv := kubetest.Start(t)
	admin, err := kube.NewClient(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	crd, err := os.ReadFile("../../deploy/kubernetes/crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	kubetest.Apply(t, admin, crd)
	kubetest.Apply(t, admin, []byte(scaleFixture))
	ctx := context.Background()
	crPath := "/apis/infera.amd.com/v1alpha1/namespaces/default/inferadeployments/demo"
	if _, err := admin.Do(ctx, http.MethodPatch, crPath+"/status", "application/merge-patch+json", []byte(
		`{"status":{"state":"pending","services":{"server":{"kind":"Deployment","replicas":1,"readyReplicas":1},`+
			`"prefill":{"replicas":1,"readyReplicas":1},"decode":{"kind":"LeaderWorkerSet","replicas":2,"readyReplicas":1}}}}`)); err != nil {
		t.Fatal(err)
	}
	// decode-1 waits for a node: the scheduler's verdict is the pool's blocked reason.
	if _, err := admin.Do(ctx, http.MethodPatch, "/api/v1/namespaces/default/pods/decode-1/status", "application/merge-patch+json", []byte(
		`{"status":{"phase":"Pending","conditions":[{"type":"PodScheduled","status":"False","reason":"Unschedulable",`+
			`"message":"0/3 nodes are available:\n 3 Insufficient amd.com/gpu."}]}}`)); err != nil {
		t.Fatal(err)
	}

	scaler := func(token, pod string) *kube.Scaler {
		cli, err := kube.NewClient(srv.As(token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cli.Close)
		return kube.NewScaler(cli, "default", pod, zerolog.Nop())
	}
	wantErr := func(what string, err error, status int, msg string) {
		t.Helper()
		var se *kube.ScaleError
		if !errors.As(err, &se) || !errors.Is(err, kube.ErrScale) {
			t.Fatalf("%s: err %v, want a scale error %d", what, err, status)
		}
		if se.HTTPStatus() != status || se.Error() != msg {
			t.Fatalf("%s: %d %q\nwant %d %q", what, se.HTTPStatus(), se.Error(), status, msg)
		}
	}

	_, err = scaler(kubetest.Token, "").ScaleGet(ctx)
	wantErr("no POD_NAME", err, 503, "scaling needs POD_NAME (downward API) to find its own deployment")
	_, err = scaler(kubetest.Token, "nope").ScaleGet(ctx)
	wantErr("pod missing", err, 503, "router Pod default/nope not found; cannot resolve deployment to scale")
	_, err = scaler(kubetest.Token, "plain").ScaleGet(ctx)
	wantErr("no label", err, 409, "this router was not created by the operator (no infera.amd.com/deployment label), so there is no deployment to scale")
	_, err = scaler(kubetest.Token, "router-ghost").ScalePost(ctx, []byte(`{"services":{"decode":3}}`))
	wantErr("no resource", err, 404, "InferaDeployment 'ghost' not found")
	_, err = scaler(kubetest.UserTokens["alice"], "router-0").ScaleGet(ctx)
	wantErr("no rbac", err, 403, "the router's ServiceAccount cannot read its own Pod; re-apply the operator RBAC")
	_, err = scaler(kubetest.UserTokens["bob"], "router-0").ScaleGet(ctx)
	wantErr("pods only", err, 403, "the router's ServiceAccount cannot read InferaDeployments; re-apply the operator RBAC")
	_, err = scaler(kubetest.UserTokens["carol"], "router-0").ScalePost(ctx, []byte(`{"services":{"decode":3}}`))
	wantErr("read only", err, 403, "the router's ServiceAccount cannot patch InferaDeployments; re-apply the operator RBAC")

	s := scaler(kubetest.Token, "router-0")
	got, err := s.ScaleGet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"deployment":"demo","namespace":"default","state":"pending","services":{` +
		`"decode":{"role":"decode","replicas":2,"current_replicas":2,"ready_replicas":1,"nodes_per_replica":2,` +
		`"blocked":"Unschedulable: 0/3 nodes are available: 3 Insufficient amd.com/gpu."},` +
		`"prefill":{"role":"prefill","replicas":1,"current_replicas":1,"ready_replicas":1,"nodes_per_replica":1},` +
		`"server":{"role":"mixed","replicas":1,"current_replicas":1,"ready_replicas":1,"nodes_per_replica":1}}}`
	if string(got) != want {
		t.Fatalf("GET view:\n%s\nwant\n%s", got, want)
	}

	refuse := ". A pool at zero stops serving, and in a PD deployment an empty prefill or decode pool fails every request. " +
		"Edit the InferaDeployment directly if that is the intent."
	for _, c := range []struct{ body, msg string }{
		{`{"services":`, "body must be JSON"},
		{`{"services":{"decode":3}}}`, "body must be JSON"},
		{``, "body must be JSON"},
		{`{"pools":{"decode":3}}`, `body must be {"services": {"<name>": {"replicas": N}}}`},
		{`{"services":[3]}`, `body must be {"services": {"<name>": {"replicas": N}}}`},
		{`{"services":{}}`, "no services named"},
		{`{"services":{"prefill":3,"bogus":1,"alpha":{"replicas":2}}}`, "no such service(s): alpha, bogus. This deployment has: decode, prefill, server"},
		{`{"services":{"decode":{"replicas":"3"}}}`, "decode: replicas must be an integer, got '3'"},
		{`{"services":{"decode":{"replicas":2.0}}}`, "decode: replicas must be an integer, got 2.0"},
		{`{"services":{"decode":{"replicas":1e16}}}`, "decode: replicas must be an integer, got 1e+16"},
		{`{"services":{"decode":{"size":3}}}`, "decode: replicas must be an integer, got None"},
		{`{"services":{"decode":true}}`, "decode: replicas must be an integer, got True"},
		{`{"services":{"decode":[1,"it's"]}}`, `decode: replicas must be an integer, got [1, "it's"]`},
		{`{"services":{"prefill":3,"decode":0}}`, "decode: refusing to scale to 0" + refuse},
		{`{"services":{"prefill":-2}}`, "prefill: refusing to scale to -2" + refuse},
	} {
		_, err := s.ScalePost(ctx, []byte(c.body))
		wantErr(c.body, err, 400, c.msg)
	}
	// None of the refused requests changed the resource.
	if got2, err := s.ScaleGet(ctx); err != nil || string(got2) != want {
		t.Fatalf("after refused requests: %s %v", got2, err)
	}

	got, err = s.ScalePost(ctx, []byte(`{"services":{"prefill":{"replicas":3},"decode":4}}`))
	if err != nil {
		t.Fatal(err)
	}
	var view kube.ScaleView
	if err := json.Unmarshal(got, &view); err != nil {
		t.Fatal(err)
	}
	if view.Services["prefill"].Replicas != 3 || view.Services["decode"].Replicas != 4 || view.Services["server"].Replicas != 1 {
		t.Fatalf("POST answer: %s", got)
	}
	raw, err := admin.Do(ctx, http.MethodGet, crPath, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var cr struct {
		Spec struct {
			Services map[string]struct {
				Replicas      int    `json:"replicas"`
				NumberOfNodes int    `json:"numberOfNodes"`
				Role          string `json:"role"`
			} `json:"services"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &cr); err != nil {
		t.Fatal(err)
	}
	sv := cr.Spec.Services
	if sv["prefill"].Replicas != 3 || sv["decode"].Replicas != 4 || sv["decode"].NumberOfNodes != 2 || sv["decode"].Role != "decode" || sv["server"].Replicas != 1 {
		t.Fatalf("resource after the patch: %s", raw)
	}
	if !strings.Contains(string(got), `"blocked":"Unschedulable`) {
		t.Fatalf("decode is still short of replicas and blocked: %s", got)
	}
}
