package main

import (
	"image"
	"image/color"
	"image/draw"

	"golang.org/x/image/font"
	"golang.org/x/image/math/fixed"
)

// canvas is the image being drawn, with the fonts to write on it.
type canvas struct {
	img *image.RGBA
	f   *faces
}

// fill paints rectangle r in colour c.
func (c *canvas) fill(r image.Rectangle, col color.Color) {
	draw.Draw(c.img, r, image.NewUniform(col), image.Point{}, draw.Src)
}

// text writes s with its baseline at (x, y) and returns the x where it ends.
func (c *canvas) text(face font.Face, col color.Color, x, y int, s string) int {
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: face, Dot: fixed.P(x, y)}
	d.DrawString(s)
	return d.Dot.X.Ceil()
}
