module github.com/envelopeworker/envelopeworker/modules/httpserve

go 1.26
