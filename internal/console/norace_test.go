//go:build !race

package console_test

const raceEnabled = false
