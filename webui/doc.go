// Package webui owns the router's embedded web assets: the live fleet page
// served at GET /dashboard on the admin address. The page is one
// self-contained HTML file (vanilla JS and CSS written for Infera, no
// third-party code, no build step); it reads GET /v1/admin/fleet and its
// SSE stream, sending the admin token the operator types in (kept in the
// tab's sessionStorage) as a Bearer header.
//
// Concurrency: the assets are immutable byte slices, safe to share.
package webui
