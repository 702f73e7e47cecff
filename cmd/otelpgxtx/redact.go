package main

import (
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// keyValuePassword matches a password in a key=value connection string.
var keyValuePassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// redact removes the DSN's password from msg, whatever form the DSN has; the connection
// error of pgx already omits it, and this keeps it so whatever the error says.
func redact(msg, dsn string) string {
	var secrets []string
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			secrets = append(secrets, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
	}
	for _, m := range keyValuePassword.FindAllStringSubmatch(dsn, -1) {
		secrets = append(secrets, strings.Trim(m[2], "'"))
	}
	if cfg, err := pgx.ParseConfig(dsn); err == nil && cfg.Password != "" {
		secrets = append(secrets, cfg.Password)
	}
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return keyValuePassword.ReplaceAllString(msg, "${1}xxxxx")
}
