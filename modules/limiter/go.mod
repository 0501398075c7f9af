module github.com/envelopeworker/envelopeworker/modules/limiter

go 1.26

require (
	github.com/sethvargo/go-limiter v0.7.1
	go.uber.org/goleak v1.3.0
)
