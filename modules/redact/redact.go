// Package redact makes URLs safe to print in errors and log lines.
//
// A URL's user info and query can carry credentials: a Pushgateway's basic-auth
// user and password, a token parameter, a DSN's password= parameter. net/url's
// URL.Redacted masks only the password and keeps the user name and the query,
// and libraries put whole URLs into their errors (client_golang's push, pgx's
// parse errors). URL keeps what tells an operator which service failed
// (scheme, host, path) and nothing else.
package redact

import "net/url"

// Marker takes the place of user info and of a query.
const Marker = "redacted"

// Unparsable stands in for text that is not an absolute URL with a host. It
// is never echoed: it may be a keyword/value DSN (password=...), or a URL
// whose secret sits where the parser gave up.
const Unparsable = "(unparsable URL)"

// URL returns raw with its user info and query replaced by Marker and its
// fragment dropped, or Unparsable.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Host == "" || u.Opaque != "" {
		return Unparsable
	}
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	if u.User != nil {
		r.User = url.User(Marker)
	}
	if u.RawQuery != "" || u.ForceQuery {
		r.RawQuery = Marker
	}
	return r.String()
}
