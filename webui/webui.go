package webui

import _ "embed" // the page is embedded in the binary

// Dashboard is the fleet page (dashboard.html). Callers must not modify it.
//
//go:embed dashboard.html
var Dashboard []byte
