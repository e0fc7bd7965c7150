// The manifests of deploy/kubernetes pass a server-side dry run against a
// real kube-apiserver (started by kubetest, built by scripts/kube-apiserver.sh
// when absent).
package kubernetes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/infera/infera/discovery/kube"
	"github.com/infera/infera/discovery/kube/kubetest"
)

// resource maps apiVersion/kind to the collection path prefix and plural.
var resource = map[string][2]string{
	"v1/ServiceAccount":                                {"/api/v1", "serviceaccounts"},
	"v1/Service":                                       {"/api/v1", "services"},
	"apps/v1/Deployment":                               {"/apis/apps/v1", "deployments"},
	"rbac.authorization.k8s.io/v1/Role":                {"/apis/rbac.authorization.k8s.io/v1", "roles"},
	"rbac.authorization.k8s.io/v1/RoleBinding":         {"/apis/rbac.authorization.k8s.io/v1", "rolebindings"},
	"apiextensions.k8s.io/v1/CustomResourceDefinition": {"/apis/apiextensions.k8s.io/v1", "customresourcedefinitions"},
}

// clusterScoped kinds are created without a namespace in their path.
var clusterScoped = map[string]bool{"CustomResourceDefinition": true}

func TestManifestsServerSideDryRun(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	srv := kubetest.Start(t)
	cli, err := kube.NewClient(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	n := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(raw, []byte("\n---\n")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Namespace string `json:"namespace"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(js, &head); err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			r, ok := resource[head.APIVersion+"/"+head.Kind]
			if !ok {
				t.Fatalf("%s #%d: no path known for %s %s", f, i, head.APIVersion, head.Kind)
			}
			ns := head.Metadata.Namespace
			if ns == "" {
				ns = "default"
			}
			path := r[0] + "/namespaces/" + ns + "/" + r[1] + "?dryRun=All&fieldValidation=Strict"
			if clusterScoped[head.Kind] {
				path = r[0] + "/" + r[1] + "?dryRun=All&fieldValidation=Strict"
			}
			if _, err := cli.Do(context.Background(), http.MethodPost, path, "application/json", js); err != nil {
				t.Errorf("%s #%d (%s): %v", f, i, head.Kind, err)
			}
			n++
		}
	}
	if n == 0 || !strings.Contains(strings.Join(files, " "), "worker.yaml") {
		t.Fatalf("checked %d objects in %v", n, files)
	}
}
