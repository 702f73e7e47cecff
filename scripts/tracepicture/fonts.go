package main

import (
	"golang.org/x/image/font"
	"golang.org/x/image/font/gofont/gobold"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"
)

// faces are the fonts the picture is written in: the Go fonts, built into x/image, so
// that the picture is the same on every machine.
type faces struct {
	regular, bold, small, title font.Face
}

// loadFaces parses the Go fonts at the picture's sizes.
func loadFaces() (*faces, error) {
	regular, err := opentype.Parse(goregular.TTF)
	if err != nil {
		return nil, err
	}
	bold, err := opentype.Parse(gobold.TTF)
	if err != nil {
		return nil, err
	}
	face := func(f *opentype.Font, size float64) (font.Face, error) {
		return opentype.NewFace(f, &opentype.FaceOptions{Size: size, DPI: 72, Hinting: font.HintingFull})
	}
	var fs faces
	for _, x := range []struct {
		dst  *font.Face
		f    *opentype.Font
		size float64
	}{{&fs.regular, regular, 13}, {&fs.bold, bold, 13}, {&fs.small, regular, 12}, {&fs.title, bold, 20}} {
		if *x.dst, err = face(x.f, x.size); err != nil {
			return nil, err
		}
	}
	return &fs, nil
}

// textWidth is how many pixels s takes in face.
func textWidth(face font.Face, s string) int {
	return font.MeasureString(face, s).Ceil()
}

// fit shortens s with an ellipsis until it takes at most w pixels.
func fit(face font.Face, s string, w int) string {
	if textWidth(face, s) <= w {
		return s
	}
	r := []rune(s)
	for len(r) > 0 && textWidth(face, string(r)+"…") > w {
		r = r[:len(r)-1]
	}
	if len(r) == 0 {
		return ""
	}
	return string(r) + "…"
}
