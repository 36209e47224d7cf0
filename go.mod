module github.com/ttquant/ttquant

go 1.26.0

require (
	github.com/google/flatbuffers v25.12.19+incompatible
	github.com/google/go-cmp v0.7.0
	github.com/klauspost/compress v1.20.4
	github.com/x448/float16 v0.8.4
	golang.org/x/sync v0.25.0
	golang.org/x/text v0.44.0
	gonum.org/v1/gonum v0.17.0
)
