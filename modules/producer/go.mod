module github.com/envelopeworker/envelopeworker/modules/producer

go 1.26

require (
	github.com/envelopeworker/envelopeworker/modules/envelope v0.1.0
	github.com/hashicorp/go-retryablehttp v0.7.8
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
)

replace github.com/envelopeworker/envelopeworker/modules/envelope => ../envelope
