package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/rs/zerolog"
)

// Labels the operator writes onto every workload it generates.
const (
	// LabelDeployment names the InferaDeployment a Pod belongs to; the
	// scaling API reads it from the server's own Pod.
	LabelDeployment = "infera.amd.com/deployment"
	// LabelService names the service (pool) of the InferaDeployment.
	LabelService = "infera.amd.com/service"
)

// The InferaDeployment custom resource (deploy/kubernetes/crd.yaml).
const (
	CRGroup   = "infera.amd.com"
	CRVersion = "v1alpha1"
	CRPlural  = "inferadeployments"
)

// ErrScale is wrapped by every ScaleError.
var ErrScale = errors.New("kube: scale")

// ScaleError is a scale request that cannot be honoured, with the HTTP
// status and message the reference answers (as {"detail": message}).
type ScaleError struct {
	Status  int
	Message string
}

func (e *ScaleError) Error() string { return e.Message }

// Unwrap makes errors.Is(err, ErrScale) true.
func (e *ScaleError) Unwrap() error { return ErrScale }

// HTTPStatus is the status the scaling API answers with.
func (e *ScaleError) HTTPStatus() int { return e.Status }

func scaleErr(status int, format string, a ...any) error {
	return &ScaleError{Status: status, Message: fmt.Sprintf(format, a...)}
}

// Container waits a Pod does not recover from on its own (reported as blocked).
var terminalWaits = []string{"ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "CreateContainerConfigError"}

// Scaler reads and resizes the pools (spec.services.<name>.replicas) of the
// InferaDeployment the server belongs to: the one named by its own Pod's
// infera.amd.com/deployment label. It writes the custom resource and
// nothing else; the operator reconciles the workloads from it. Safe for
// concurrent use.
type Scaler struct {
	cli     *Client
	ns, pod string
	log     zerolog.Logger

	mu         sync.Mutex
	deployment string // resolved once from the Pod's labels
}

// NewScaler returns the scaler of the server Pod namespace/podName
// (POD_NAME; "" answers 503 as the reference does).
func NewScaler(cli *Client, namespace, podName string, log zerolog.Logger) *Scaler {
	return &Scaler{cli: cli, ns: namespace, pod: podName, log: log}
}

// PoolView is one service in the GET /v1/admin/scale answer.
type PoolView struct {
	Role            string `json:"role"`
	Replicas        int64  `json:"replicas"`
	CurrentReplicas int64  `json:"current_replicas"`
	ReadyReplicas   int64  `json:"ready_replicas"`
	NodesPerReplica int64  `json:"nodes_per_replica"`
	Blocked         string `json:"blocked,omitempty"`
}

// ScaleView is the GET /v1/admin/scale answer: each pool's requested and
// observed size and the operator's state.
type ScaleView struct {
	Deployment string              `json:"deployment"`
	Namespace  string              `json:"namespace"`
	State      string              `json:"state"`
	Services   map[string]PoolView `json:"services"`
}

// JSON encodes the view as the reference's server does: compact, keys in
// the order above, services sorted by name, no HTML escaping.
func (v *ScaleView) JSON() []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // strings, ints and a map of them: cannot fail
	return bytes.TrimRight(b.Bytes(), "\n")
}

func (s *Scaler) podPath(name string) string {
	return "/api/v1/namespaces/" + url.PathEscape(s.ns) + "/pods/" + url.PathEscape(name)
}

func (s *Scaler) crPath(name string) string {
	return "/apis/" + CRGroup + "/" + CRVersion + "/namespaces/" + url.PathEscape(s.ns) + "/" + CRPlural + "/" + url.PathEscape(name)
}

func statusCode(err error) int {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

// resolve finds the InferaDeployment from the server Pod's labels.
func (s *Scaler) resolve(ctx context.Context) (string, error) {
	s.mu.Lock()
	name := s.deployment
	s.mu.Unlock()
	if name != "" {
		return name, nil
	}
	if s.pod == "" {
		return "", scaleErr(http.StatusServiceUnavailable, "scaling needs POD_NAME (downward API) to find its own deployment")
	}
	b, err := s.cli.Do(ctx, http.MethodGet, s.podPath(s.pod), "", nil)
	switch statusCode(err) {
	case 0:
	case http.StatusForbidden:
		return "", scaleErr(http.StatusForbidden, "the router's ServiceAccount cannot read its own Pod; re-apply the operator RBAC")
	case http.StatusNotFound:
		return "", scaleErr(http.StatusServiceUnavailable, "router Pod %s/%s not found; cannot resolve deployment to scale", s.ns, s.pod)
	}
	if err != nil {
		return "", fmt.Errorf("kube: read the server pod: %w", err)
	}
	var p struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return "", fmt.Errorf("%w: decode json: %w", ErrInvalidPod, err)
	}
	name = p.Metadata.Labels[LabelDeployment]
	if name == "" {
		return "", scaleErr(http.StatusConflict, "this router was not created by the operator (no %s label), so there is no deployment to scale", LabelDeployment)
	}
	s.mu.Lock()
	s.deployment = name
	s.mu.Unlock()
	return name, nil
}

// inferaDeployment holds the fields of the custom resource the scaler reads.
type inferaDeployment struct {
	Spec struct {
		Services map[string]struct {
			Role          string `json:"role"`
			Replicas      *int64 `json:"replicas"`
			NumberOfNodes *int64 `json:"numberOfNodes"`
		} `json:"services"`
	} `json:"spec"`
	Status struct {
		State    string `json:"state"`
		Services map[string]struct {
			Replicas      int64 `json:"replicas"`
			ReadyReplicas int64 `json:"readyReplicas"`
		} `json:"services"`
	} `json:"status"`
}

func (s *Scaler) fetch(ctx context.Context, name string) (*inferaDeployment, error) {
	b, err := s.cli.Do(ctx, http.MethodGet, s.crPath(name), "", nil)
	switch statusCode(err) {
	case 0:
	case http.StatusForbidden:
		return nil, scaleErr(http.StatusForbidden, "the router's ServiceAccount cannot read InferaDeployments; re-apply the operator RBAC")
	case http.StatusNotFound:
		return nil, scaleErr(http.StatusNotFound, "InferaDeployment %s not found", pyRepr(name))
	}
	if err != nil {
		return nil, fmt.Errorf("kube: read InferaDeployment %s: %w", name, err)
	}
	var cr inferaDeployment
	if err := json.Unmarshal(b, &cr); err != nil {
		return nil, fmt.Errorf("kube: decode InferaDeployment %s: %w", name, err)
	}
	return &cr, nil
}

// Snapshot returns every pool's requested size (spec) and observed size
// (status); a pool with fewer ready replicas than requested carries the
// reason its Pods do not run when the cluster says one.
func (s *Scaler) Snapshot(ctx context.Context) (*ScaleView, error) {
	name, err := s.resolve(ctx)
	if err != nil {
		return nil, err
	}
	cr, err := s.fetch(ctx, name)
	if err != nil {
		return nil, err
	}
	v := &ScaleView{Deployment: name, Namespace: s.ns, State: cr.Status.State, Services: map[string]PoolView{}}
	if v.State == "" {
		v.State = "unknown"
	}
	for svc, cfg := range cr.Spec.Services {
		p := PoolView{Role: cfg.Role, Replicas: 1, NodesPerReplica: 1}
		if p.Role == "" {
			p.Role = "mixed"
		}
		if cfg.Replicas != nil {
			p.Replicas = *cfg.Replicas
		}
		if cfg.NumberOfNodes != nil {
			p.NodesPerReplica = *cfg.NumberOfNodes
		}
		obs := cr.Status.Services[svc]
		p.CurrentReplicas, p.ReadyReplicas = obs.Replicas, obs.ReadyReplicas
		if p.ReadyReplicas < p.Replicas {
			p.Blocked = s.blocked(ctx, name, svc)
		}
		v.Services[svc] = p
	}
	return v, nil
}

// blocked reports why a pool's Pods are not running, if the cluster says
// so: the scheduler's verdict on a Pending Pod, or a container wait it does
// not recover from. Best effort: "" when the Pods cannot be read.
func (s *Scaler) blocked(ctx context.Context, name, svc string) string {
	sel := LabelDeployment + "=" + name + "," + LabelService + "=" + svc
	b, err := s.cli.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+url.PathEscape(s.ns)+"/pods?labelSelector="+url.QueryEscape(sel), "", nil)
	if err != nil {
		s.log.Debug().Err(err).Str("deployment", name).Str("service", svc).Msg("kube: could not read the pool's Pods")
		return ""
	}
	var l struct {
		Items []struct {
			Status struct {
				Phase      string `json:"phase"`
				Conditions []struct {
					Type, Status, Reason, Message string
				} `json:"conditions"`
				ContainerStatuses []struct {
					State struct {
						Waiting *struct{ Reason, Message string } `json:"waiting"`
					} `json:"state"`
				} `json:"containerStatuses"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return ""
	}
	for _, p := range l.Items {
		if p.Status.Phase != "Pending" {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == "PodScheduled" && c.Status == "False" {
				return oneLine(c.Reason, c.Message)
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && slices.Contains(terminalWaits, w.Reason) {
				return oneLine(w.Reason, w.Message)
			}
		}
	}
	return ""
}

// oneLine joins a reason and its message on one line of at most ~300
// characters (scheduler messages list every node).
func oneLine(reason, message string) string {
	text := strings.Join(strings.Fields(message), " ")
	if r := []rune(text); len(r) > 300 {
		text = string(r[:297]) + "..."
	}
	switch {
	case reason != "" && text != "":
		return reason + ": " + text
	case reason != "":
		return reason
	case text != "":
		return text
	}
	return "unknown"
}

// ScaleRequest is one pool's requested replica count, as the client sent
// it (a JSON value: validated by Scale).
type ScaleRequest struct {
	Service  string
	Replicas json.RawMessage // nil: absent ({"replicas"} missing)
}

// ParseScaleBody reads a POST /v1/admin/scale body:
// {"services":{"<name>":{"replicas":N}}} or {"services":{"<name>":N}}.
func ParseScaleBody(body []byte) ([]ScaleRequest, error) {
	var top any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&top); err != nil {
		return nil, scaleErr(http.StatusBadRequest, "body must be JSON")
	}
	if _, err := dec.Token(); err != io.EOF { // one value, as json.loads reads
		return nil, scaleErr(http.StatusBadRequest, "body must be JSON")
	}
	var services json.RawMessage
	if obj, ok := top.(map[string]any); ok && obj["services"] != nil {
		var raw map[string]json.RawMessage
		_ = json.Unmarshal(body, &raw) // decoded above
		services = raw["services"]
	}
	members, ok := objectMembers(services)
	if !ok {
		return nil, scaleErr(http.StatusBadRequest, `body must be {"services": {"<name>": {"replicas": N}}}`)
	}
	out := make([]ScaleRequest, 0, len(members))
	for _, m := range members {
		r := ScaleRequest{Service: m.key, Replicas: m.val}
		if inner, ok := objectMembers(m.val); ok {
			r.Replicas = nil
			for _, im := range inner {
				if im.key == "replicas" {
					r.Replicas = im.val // the last one wins, as in Python
				}
			}
		}
		out = append(out, r)
	}
	return out, nil
}

type member struct {
	key string
	val json.RawMessage
}

// objectMembers returns an object's members in order, a repeated key
// keeping its first place and its last value (as a Python dict does).
func objectMembers(raw json.RawMessage) ([]member, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	var out []member
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		if i := slices.IndexFunc(out, func(m member) bool { return m.key == k }); i >= 0 {
			out[i].val = v
			continue
		}
		out = append(out, member{k, v})
	}
	return out, true
}

// Scale sets the named pools' replicas in one merge patch of the custom
// resource (all or none) and returns the snapshot after the write. It
// refuses an empty request, unknown services (listing the valid ones),
// non-integers and counts below 1: a pool at zero stops serving, and an
// empty PD pool fails every request.
func (s *Scaler) Scale(ctx context.Context, reqs []ScaleRequest) (*ScaleView, error) {
	if len(reqs) == 0 {
		return nil, scaleErr(http.StatusBadRequest, "no services named")
	}
	name, err := s.resolve(ctx)
	if err != nil {
		return nil, err
	}
	cr, err := s.fetch(ctx, name)
	if err != nil {
		return nil, err
	}
	counts, err := validateScale(reqs, cr)
	if err != nil {
		return nil, err
	}
	patch := []byte(`{"spec":{"services":{`)
	for i, r := range reqs {
		if i > 0 {
			patch = append(patch, ',')
		}
		k, _ := json.Marshal(r.Service)
		patch = append(patch, k...)
		patch = append(patch, `:{"replicas":`...)
		patch = append(patch, counts[i]...)
		patch = append(patch, '}')
	}
	patch = append(patch, "}}}"...)
	_, err = s.cli.Do(ctx, http.MethodPatch, s.crPath(name), "application/merge-patch+json", patch)
	if statusCode(err) == http.StatusForbidden {
		return nil, scaleErr(http.StatusForbidden, "the router's ServiceAccount cannot patch InferaDeployments; re-apply the operator RBAC")
	}
	if err != nil {
		return nil, fmt.Errorf("kube: patch InferaDeployment %s: %w", name, err)
	}
	sorted := slices.Clone(reqs)
	slices.SortFunc(sorted, func(a, b ScaleRequest) int { return strings.Compare(a.Service, b.Service) })
	parts := make([]string, len(sorted))
	for i, r := range sorted {
		parts[i] = r.Service + "=" + strings.TrimSpace(string(r.Replicas))
	}
	s.log.Info().Str("deployment", name).Str("services", strings.Join(parts, ", ")).Msg("scaled InferaDeployment")
	return s.Snapshot(ctx)
}

// validateScale checks a request against the resource's services and
// returns each count as the integer literal to write.
func validateScale(reqs []ScaleRequest, cr *inferaDeployment) ([]string, error) {
	known := make([]string, 0, len(cr.Spec.Services))
	for k := range cr.Spec.Services {
		known = append(known, k)
	}
	slices.Sort(known)
	var unknown []string
	for _, r := range reqs {
		if _, ok := cr.Spec.Services[r.Service]; !ok {
			unknown = append(unknown, r.Service)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, scaleErr(http.StatusBadRequest, "no such service(s): %s. This deployment has: %s",
			strings.Join(unknown, ", "), strings.Join(known, ", "))
	}
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(reqs[a].Service, reqs[b].Service) })
	counts := make([]string, len(reqs))
	for _, i := range order {
		r := reqs[i]
		n, ok := intLiteral(r.Replicas)
		if !ok {
			return nil, scaleErr(http.StatusBadRequest, "%s: replicas must be an integer, got %s", r.Service, reprJSON(r.Replicas))
		}
		if n.Sign() < 1 {
			return nil, scaleErr(http.StatusBadRequest, "%s: refusing to scale to %s. A pool at zero stops serving, "+
				"and in a PD deployment an empty prefill or decode pool fails every request. "+
				"Edit the InferaDeployment directly if that is the intent.", r.Service, n.String())
		}
		counts[i] = n.String()
	}
	return counts, nil
}

// intLiteral reads a JSON integer (Python's json reads "3" as an int and
// "3.0" or "3e0" as a float).
func intLiteral(raw json.RawMessage) (*big.Int, bool) {
	s := strings.TrimSpace(string(raw))
	if s == "" || strings.ContainsAny(s, ".eE") {
		return nil, false
	}
	n, ok := new(big.Int).SetString(s, 10)
	return n, ok
}

// ScaleGet is GET /v1/admin/scale: the snapshot as JSON (router.ScaleAPI).
func (s *Scaler) ScaleGet(ctx context.Context) ([]byte, error) {
	v, err := s.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return v.JSON(), nil
}

// ScalePost is POST /v1/admin/scale: parse the body, scale, and return the
// snapshot after the write as JSON (router.ScaleAPI).
func (s *Scaler) ScalePost(ctx context.Context, body []byte) ([]byte, error) {
	reqs, err := ParseScaleBody(body)
	if err != nil {
		return nil, err
	}
	v, err := s.Scale(ctx, reqs)
	if err != nil {
		return nil, err
	}
	return v.JSON(), nil
}
