package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// hasProgram reports whether the server's installation has the program name: the npm
// packages' builds (scripts/postgres) ship initdb, pg_ctl and postgres only.
func (s *Server) hasProgram(name string) bool {
	fi, err := os.Stat(s.bin(name))
	return err == nil && fi.Mode().IsRegular()
}

// baseBackup makes s's data directory a base backup of src, the running primary: with
// pg_basebackup where the installation has it, else with the server's low-level backup
// functions and a copy of the data directory made here, which is what pg_basebackup
// does over the replication protocol. Either way the copy is a standby's starting point;
// the WAL it needs streams from src (wal_keep_size keeps it there).
func (s *Server) baseBackup(ctx context.Context, src *Server) error {
	if s.hasProgram("pg_basebackup") {
		return s.run(ctx, s.bin("pg_basebackup"), "-D", s.dataDir, "-d", src.ConnString(), "-X", "stream", "--no-sync")
	}
	return src.withConn(ctx, func(c *pgx.Conn) error {
		var version int
		if err := c.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
			return err
		}
		// PostgreSQL 15 renamed the non-exclusive backup functions (pg_start_backup and
		// pg_stop_backup, whose exclusive mode it removed).
		start, stop := "SELECT pg_backup_start('pgtest', true)", "SELECT labelfile FROM pg_backup_stop(true)"
		if version < 150000 {
			start, stop = "SELECT pg_start_backup('pgtest', true, false)", "SELECT labelfile FROM pg_stop_backup(false, true)"
		}
		if _, err := c.Exec(ctx, start); err != nil {
			return fmt.Errorf("pgtest: starting a base backup of %s: %w", src.dataDir, err)
		}
		copyErr := s.copyDataDir(src.dataDir)
		// The backup ends on this session whatever the copy did, or src keeps
		// full_page_writes forced on for it.
		var label string
		if err := c.QueryRow(ctx, stop).Scan(&label); err != nil {
			return errors.Join(copyErr, fmt.Errorf("pgtest: ending the base backup of %s: %w", src.dataDir, err))
		}
		if copyErr != nil {
			return copyErr
		}
		return s.writeOwned(filepath.Join(s.dataDir, "backup_label"), []byte(label))
	})
}

// backupSkips are the files of a running server's data directory that a base backup
// leaves out, as pg_basebackup does: the running server's own, and the signal and label
// files of the source's own recovery.
var backupSkips = map[string]bool{
	"postmaster.pid": true, "postmaster.opts": true, "standby.signal": true, "backup_label": true,
}

// backupEmptied are the directories a base backup copies empty: the server's state rather
// than the cluster's. WAL streams from the primary instead of being copied.
var backupEmptied = map[string]bool{
	"pg_wal": true, "pg_replslot": true, "pg_stat_tmp": true, "pg_dynshmem": true,
	"pg_notify": true, "pg_serial": true, "pg_snapshots": true, "pg_subtrans": true,
}

// copyDataDir copies the data directory from into s.dataDir (which must not exist),
// owned by the server's user. Files that vanish while it copies are left out, as the
// server may remove them (temporary files, old WAL) during a backup.
func (s *Server) copyDataDir(from string) error {
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		to := filepath.Join(s.dataDir, rel)
		switch {
		case d.IsDir() && strings.HasPrefix(d.Name(), "pgsql_tmp"):
			return fs.SkipDir // a backend's temporary files
		case d.IsDir():
			if err := s.mkdirOwned(to); err != nil {
				return err
			}
			if backupEmptied[filepath.ToSlash(rel)] {
				if rel == "pg_wal" {
					// The server expects pg_wal/archive_status to exist.
					if err := s.mkdirOwned(filepath.Join(to, "archive_status")); err != nil {
						return err
					}
				}
				return fs.SkipDir
			}
			return nil
		case backupSkips[rel] || d.Name() == "pg_internal.init" || !d.Type().IsRegular():
			return nil // the relation cache's files are rebuilt at start, as pg_basebackup leaves them out
		}
		b, err := readFileIfExists(path)
		if err != nil || b == nil {
			return err
		}
		return s.writeOwned(to, b)
	})
}

// readFileIfExists returns a file's contents, or nil and no error when it vanished.
func readFileIfExists(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f) // never nil, even for an empty file
	return b, errors.Join(err, f.Close())
}

// mkdirOwned makes a directory of the data directory, mode 0700 as the server requires,
// owned by the server's user.
func (s *Server) mkdirOwned(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	return s.chown(dir)
}

// writeOwned writes a file of the data directory, owned by the server's user.
func (s *Server) writeOwned(path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	return s.chown(path)
}

// chown gives path to the server's user when the harness runs the server as another user.
func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	return os.Chown(path, int(s.cred.Uid), int(s.cred.Gid))
}
