package server

import (
	"context"
	"encoding/base64"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/modules/receiver"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/outboundkeys"
)

// getOutboundKeys is GET /v1/outbound-keys (contract §8.10): the public
// keys receivers verify the credential's tenant's outbound envelopes with,
// the current one first. The answer type is the receiver module's, the
// client that reads it. A tenant without a key answers 200 with an empty
// list: having no key is a state, not an error, and a receiver treats it
// as "nothing verifies yet".
func (s *Server) getOutboundKeys(c echo.Context) error {
	return serveTenantRead(s, c, "outbound_keys", func(ctx context.Context, tenant string) (any, error) {
		keys, err := outboundkeys.PublicKeys(ctx, s.keys, tenant)
		if err != nil {
			return nil, err // never ErrNotFound: a tenant without a key has an empty list
		}
		ans := receiver.OutboundKeys{Keys: make([]receiver.OutboundKey, 0, len(keys))}
		for _, k := range keys {
			ans.Keys = append(ans.Keys, receiver.OutboundKey{
				KeyID:     k.KeyID,
				PublicKey: base64.RawURLEncoding.EncodeToString(k.Key),
				Current:   k.Current,
			})
		}
		return ans, nil
	})
}
