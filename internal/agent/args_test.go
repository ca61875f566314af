package agent

import (
	"errors"
	"testing"
)

func TestParseArguments(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		repaired       bool
		bad            bool
	}{
		{"object", `{"volume": 30}`, `{"volume":30}`, false, false},
		{"empty", ``, `{}`, false, false},
		{"null", `null`, `{}`, true, false},
		{"double encoded", `"{\"volume\":30}"`, `{"volume":30}`, false, false},
		{"fenced", "```json\n{\"volume\": 30}\n```", `{"volume":30}`, true, false},
		{"fenced without info", "```{\"volume\": 30}```", `{"volume":30}`, true, false},
		{"trailing comma", `{"volume": 30,}`, `{"volume":30}`, true, false},
		{"trailing comma in array", `{"a": [1, 2, ], }`, `{"a":[1,2]}`, true, false},
		{"missing brace", `{"volume": 30`, `{"volume":30}`, true, false},
		{"cut in a string", `{"theme": "da`, `{"theme":"da"}`, true, false},
		{"cut after a colon", `{"theme":`, `{"theme":null}`, true, false},
		{"prose around", `Sure: {"volume": 30} hope that helps`, `{"volume":30}`, true, false},
		{"nested", `{"a": {"b": [1, {"c": 2`, `{"a":{"b":[1,{"c":2}]}}`, true, false},
		{"braces in strings", `{"s": "}{,]"`, `{"s":"}{,]"}`, true, false},
		{"array", `[1,2]`, ``, false, true},
		{"number", `42`, ``, false, true},
		{"garbage", `volume=30`, ``, false, true},
		{"unquoted keys", `{volume: 30}`, ``, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, repaired, err := parseArguments(tc.in)
			if tc.bad {
				if !errors.Is(err, errBadArguments) {
					t.Fatalf("parseArguments(%q) = %s, %v; want errBadArguments", tc.in, got, err)
				}
				return
			}
			if err != nil || string(got) != tc.want || repaired != tc.repaired {
				t.Fatalf("parseArguments(%q) = %s, repaired %v, %v; want %s, repaired %v", tc.in, got, repaired, err, tc.want, tc.repaired)
			}
		})
	}
}

func FuzzParseArguments(f *testing.F) {
	for _, s := range []string{`{"a":1}`, "```json\n{\"a\":[1,\n```", `{"a":"\`, `"{\"x\":1}"`, `{,}`, `}}{{`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, _, err := parseArguments(in)
		if err != nil {
			if !errors.Is(err, errBadArguments) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if _, ok := asObject(got); !ok {
			t.Fatalf("parseArguments(%q) = %s, not a JSON object", in, got)
		}
	})
}
