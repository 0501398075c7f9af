module github.com/envelopeworker/envelopeworker/modules/redact

go 1.26
