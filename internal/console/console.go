// Package console is the gateway's web console: a page of native ES modules
// and CSS, embedded in the binary, served at / and /console/. It has no
// server side of its own: everything it shows and does goes through the REST
// API (internal/api) with the API key the user pastes, so it can do exactly
// what that key can, and nothing more.
//
// The files are served with a strict Content-Security-Policy (same-origin
// scripts, styles, images and connections only) and may not be framed; the
// gateway puts the handler behind the same Host/Origin guard as REST.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed static
var files embed.FS

// Prefix is where the console's files are served; / serves its page too.
const Prefix = "/console/"

// Favicon is where browsers ask for a site's icon unasked: the console's
// icon is served there too, without a key, so no load logs a refusal.
const Favicon = "/favicon.ico"

// csp allows what the console needs and nothing else: its own scripts and
// styles, images and audio from data: and blob: URLs (tool results, photos
// fetched with the key), and requests to the gateway itself.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; " +
	"media-src 'self' data: blob:; connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"

// Handler serves the console: its page at / and /console/ (and any other
// path under /console/ that is not a file, since the page routes with the
// URL fragment), its modules, stylesheet and icon under /console/, and the
// icon at /favicon.ico.
func Handler() http.Handler {
	static, err := fs.Sub(files, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	fileServer := http.FileServerFS(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		// Small files, and a new binary must not run an old page.
		h.Set("Cache-Control", "no-cache")
		name := strings.TrimPrefix(r.URL.Path, Prefix)
		if r.URL.Path == Favicon {
			name = "icon.svg"
		} else if r.URL.Path == "/" || r.URL.Path+"/" == Prefix || name == "" || name == "index.html" || !exists(static, name) {
			serveIndex(w, r, static)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + name
		fileServer.ServeHTTP(w, r2)
	})
}

func exists(fsys fs.FS, name string) bool {
	st, err := fs.Stat(fsys, name)
	return err == nil && !st.IsDir()
}

func serveIndex(w http.ResponseWriter, r *http.Request, fsys fs.FS) {
	b, err := fs.ReadFile(fsys, "index.html")
	if err != nil {
		http.Error(w, "console page missing from the build", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(b)
}
