// Package imageproc is the image side of the FramePack pipeline: decoding user images to RGB,
// resolution buckets, Pillow-compatible resampling (LANCZOS resize-to-cover with a centre crop for
// the start frame, BICUBIC for the SigLIP processor), and the pixel helpers of the section loop
// (soft blending of decoded sections and the uint8 conversion used for the MP4).
//
// Everything here follows the reference implementation bit for bit where the reference is
// deterministic: FramePack's diffusers_helper (bucket_tools.py, utils.py) and Pillow's resampler
// (8-bit, 22-bit fixed-point coefficients, horizontal pass then vertical pass). Where decoding can
// only be close to Pillow (JPEG, whose IDCT differs between libjpeg and Go), the doc comment of the
// function says so.
package imageproc
