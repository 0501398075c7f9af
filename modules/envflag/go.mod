module github.com/envelopeworker/envelopeworker/modules/envflag

go 1.26
