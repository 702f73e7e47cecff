package main

import (
	"reflect"
	"strings"
	"testing"
)

// events builds test2json output, one JSON object a line.
func events(lines ...string) *strings.Reader {
	return strings.NewReader(strings.Join(lines, "\n") + "\n")
}

func TestParseEvents(t *testing.T) {
	res, err := parseEvents(events(
		`{"Action":"start","Package":"pgx"}`,
		`{"Action":"run","Package":"pgx","Test":"TestA"}`,
		`{"Action":"run","Package":"pgx","Test":"TestA/sub"}`,
		`{"Action":"output","Package":"pgx","Test":"TestA/sub","Output":"    a_test.go:9: wrong\n"}`,
		`{"Action":"fail","Package":"pgx","Test":"TestA/sub","Elapsed":0.01}`,
		`{"Action":"fail","Package":"pgx","Test":"TestA","Elapsed":0.02}`,
		`{"Action":"run","Package":"pgx","Test":"TestB"}`,
		`{"Action":"pass","Package":"pgx","Test":"TestB","Elapsed":0.1}`,
		`{"Action":"run","Package":"pgx","Test":"TestC"}`,
		`{"Action":"skip","Package":"pgx","Test":"TestC","Elapsed":0}`,
		`{"Action":"run","Package":"pgx","Test":"TestD"}`,
		`{"Action":"output","Package":"pgx","Test":"TestD","Output":"panic: boom\n"}`,
		`{"Action":"output","Package":"pgx","Output":"WARNING: DATA RACE\n"}`,
		`{"Action":"fail","Package":"pgx","Elapsed":1.5}`,
	))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"TestA": fail, "TestA/sub": fail, "TestB": pass, "TestC": skip, "TestD": notRun}
	if !reflect.DeepEqual(res.status, want) {
		t.Errorf("status = %v, want %v", res.status, want)
	}
	if p, f, s, n := res.counts(); p != 1 || f != 2 || s != 1 || n != 1 {
		t.Errorf("counts = %d pass, %d fail, %d skip, %d not run; want 1, 2, 1, 1", p, f, s, n)
	}
	if !res.ended || res.passed || res.elapsed != 1.5 {
		t.Errorf("package: ended %v passed %v elapsed %v; want true false 1.5", res.ended, res.passed, res.elapsed)
	}
	wantPanics := []string{"TestD: panic: boom", "(package): WARNING: DATA RACE"}
	if !reflect.DeepEqual(res.panics, wantPanics) {
		t.Errorf("panics = %q, want %q", res.panics, wantPanics)
	}
	if got := res.tail("TestA/sub", 5); got != "    a_test.go:9: wrong" {
		t.Errorf("tail = %q", got)
	}
	if got := res.get("TestNeverStarted"); got != notRun {
		t.Errorf("a test the run never started: %q, want %q", got, notRun)
	}
	if got := res.with(fail); !reflect.DeepEqual(got, []string{"TestA", "TestA/sub"}) {
		t.Errorf("with(fail) = %q", got)
	}
}

func TestParseEventsRejectsNonJSON(t *testing.T) {
	if _, err := parseEvents(events(`--- FAIL: TestA`)); err == nil {
		t.Fatal("a line that is not test2json's was accepted")
	}
}

func TestTopLevel(t *testing.T) {
	for in, want := range map[string]string{"TestA": "TestA", "TestA/b/c": "TestA"} {
		if got := topLevel(in); got != want {
			t.Errorf("topLevel(%q) = %q, want %q", in, got, want)
		}
	}
}
