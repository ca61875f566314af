package storetest

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"

	_ "modernc.org/sqlite" // the "sqlite" driver
)

// CorruptTable overwrites with garbage the pages of table, and of its
// indexes, in the closed SQLite database at path, as on a damaged disk:
// reading the table fails with SQLITE_CORRUPT, and so the store's open (its
// PRAGMA quick_check).
func CorruptTable(t testing.TB, path, table string) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var pageSize int
	if err := db.QueryRowContext(context.Background(), `PRAGMA page_size`).Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(context.Background(), `SELECT rootpage FROM sqlite_schema WHERE tbl_name = ? AND rootpage > 0`, table)
	if err != nil {
		t.Fatal(err)
	}
	var pages []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			t.Fatal(err)
		}
		pages = append(pages, p)
	}
	if err := rows.Err(); err != nil || len(pages) == 0 {
		t.Fatalf("the pages of table %s: %v, %v", table, pages, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	garbage := []byte(strings.Repeat("\xff", pageSize))
	for _, p := range pages {
		if _, err := f.WriteAt(garbage, int64(p-1)*int64(pageSize)); err != nil {
			t.Fatal(err)
		}
	}
}

// TablelessFile creates at path a SQLite database in WAL mode holding no
// table (its header page only), as a cp of a young live store leaves, and
// returns it open; it is closed when the test ends.
func TablelessFile(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	return db
}
