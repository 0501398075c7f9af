module github.com/envelopeworker/envelopeworker/modules/envelope

go 1.26

require filippo.io/edwards25519 v1.1.0
