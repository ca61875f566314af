package deviceid

import (
	"errors"
	"testing"
)

func TestCheck(t *testing.T) {
	for id, reserved := range map[string]bool{
		"endpoint-calc":     true,
		"Endpoint-Calc":     true,
		"..":                true,
		".":                 true,
		"02:00:00:00:00:01": false,
		"endpointless":      false,
		"...":               false,
		"kitchen-endpoint-": false,
	} {
		if err := Check(id); errors.Is(err, ErrReserved) != reserved {
			t.Errorf("Check(%q) = %v, want reserved %v", id, err, reserved)
		}
	}
}
