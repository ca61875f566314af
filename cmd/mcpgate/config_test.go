package main

import "testing"

func TestDeviceURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8000":      "ws://127.0.0.1:8000/xiaozhi/v1/",
		"127.0.0.1:8000":             "ws://127.0.0.1:8000/xiaozhi/v1/",
		"https://gw.example/prefix/": "wss://gw.example/prefix/xiaozhi/v1/",
	} {
		if got, err := deviceURL(in); err != nil || got != want {
			t.Errorf("deviceURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := deviceURL("ftp://x"); err == nil {
		t.Error("ftp accepted")
	}
}
