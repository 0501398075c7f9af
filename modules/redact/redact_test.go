package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	cases := []struct{ in, want string }{
		{"https://push.example:9091", "https://push.example:9091"},
		{"https://push.example:9091/base/", "https://push.example:9091/base/"},
		{"https://user:s3cret@push.example/base", "https://redacted@push.example/base"},
		{"https://user@push.example/", "https://redacted@push.example/"},
		{"https://:s3cret@push.example/", "https://redacted@push.example/"},
		{"https://push.example/hook?token=s3cret&x=1", "https://push.example/hook?redacted"},
		{"https://push.example/hook?", "https://push.example/hook?redacted"},
		{"https://push.example/hook#s3cret", "https://push.example/hook"},
		{"https://u:p%40ss@push.example/a%2Fb?token=s3cret#frag", "https://redacted@push.example/a%2Fb?redacted"},
		{"postgres://janitor:s3cret@db:5432/envelopeworker?sslmode=verify-full&password=s3cret", "postgres://redacted@db:5432/envelopeworker?redacted"},
		// Not an absolute URL with a host: nothing of it is echoed.
		{"host=db user=janitor password=s3cret", Unparsable},
		{"user:s3cret@push.example/base", Unparsable},
		{"push.example:9091", Unparsable},
		{"mailto:s3cret@example.com", Unparsable},
		{"https://user:s3cret@[::1/", Unparsable},
		{"/relative?token=s3cret", Unparsable},
		{"", Unparsable},
	}
	for _, c := range cases {
		got := URL(c.in)
		if got != c.want {
			t.Errorf("URL(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.Contains(got, "s3cret") {
			t.Errorf("URL(%q) = %q keeps the secret", c.in, got)
		}
	}
}
