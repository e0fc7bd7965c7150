#!/usr/bin/env bash
# Builds kube-apiserver from the Go module proxy (k8s.io/kubernetes has replace
# directives, so `go install` cannot build it) into a scratch module and caches
# the binary by version under bin/kube/ (ignored). Prints the binary's path.
# Tests that need a real Kubernetes API server call this when the binary is
# absent; a cold build takes ~6 min on 2 cores, a warm Go build cache ~10 s.
set -euo pipefail
ver="${KUBE_VERSION:-v1.37.2}"
staging="0.${ver#v1.}"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${KUBE_APISERVER_DIR:-$root/bin/kube}/kube-apiserver-$ver"
if [ -x "$out" ]; then echo "$out"; exit 0; fi
mods="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
cri-client cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt
kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
mount-utils pod-security-admission sample-apiserver streaming"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
{
  echo "module kubeapiserverbuild"
  echo
  echo "go 1.25"
  echo
  echo "require k8s.io/kubernetes $ver"
  for m in $mods; do echo "replace k8s.io/$m => k8s.io/$m v$staging"; done
} >go.mod
cat >tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
GOFLAGS=-mod=mod go mod tidy >&2
minor="${ver#v1.}"; minor="${minor%%.*}"
mkdir -p "$(dirname "$out")"
go build -trimpath -o "$out.tmp" -ldflags "-s -w \
  -X k8s.io/component-base/version.gitVersion=$ver \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$minor" k8s.io/kubernetes/cmd/kube-apiserver >&2
mv "$out.tmp" "$out"
echo "$out"
