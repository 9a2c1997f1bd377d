module github.com/ringtrain/ringtrain

go 1.26.8

require go.uber.org/goleak v1.3.0

require golang.org/x/image v0.47.0
