"""What a refused upload reports: the index's status and its own words, on one line, from twine's
verbose output as twine 7.0.0 prints it (rich log records, wide, no colour)."""

from __future__ import annotations

from release.trust.twine_upload import failure, server_text

_PYPISERVER_507 = """\
Uploading activekv-0.1.0-py3-none-any.whl
WARNING  Received "507: Insufficient Storage"
         Package upload appears to have failed. Retry 5 of 5.
INFO     Response from http://127.0.0.1:36901/:
         507 Insufficient Storage
INFO
             <!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">
             <html>
                 <head>
                     <title>Error: 507 Insufficient Storage</title>
                     <style type="text/css">
                       pre {background-color: #eee; border: 1px solid #ddd; padding: 5px;}
                     </style>
                 </head>
                 <body>
                     <h1>Error: 507 Insufficient Storage</h1>
                     <pre>cannot store x.whl in the index&#039;s package folder: No space left
                     on device (ENOSPC); nothing was kept</pre>
                 </body>
             </html>
ERROR    HTTPError: 507 Insufficient Storage from http://127.0.0.1:36901/
         Insufficient Storage
"""


def test_an_error_page_is_reduced_to_what_the_server_said() -> None:
    assert failure(_PYPISERVER_507) == (
        "the index answered 507 Insufficient Storage: cannot store x.whl in the index's package "
        "folder: No space left on device (ENOSPC); nothing was kept"
    )


def test_the_last_response_is_the_one_reported() -> None:
    earlier = _PYPISERVER_507.replace("507 Insufficient Storage\nINFO", "500 Oops\nINFO", 1)
    assert failure(earlier + _PYPISERVER_507).startswith("the index answered 507 ")


def test_a_response_without_a_body_reports_its_status() -> None:
    output = "INFO     Response from http://x/:\n         403 Forbidden\nERROR    HTTPError: 403\n"
    assert failure(output) == "the index answered 403 Forbidden"


def test_a_plain_text_or_json_answer_is_kept_as_one_line() -> None:
    output = ('INFO     Response from https://devpi/u/i/:\n         409 Conflict\n'
              'INFO     {"message": "activekv-0.1.0.whl already exists in\n  non-volatile index"}\n'
              "ERROR    HTTPError: 409 Conflict from https://devpi/u/i/\n")  # fmt: skip
    assert failure(output) == (
        'the index answered 409 Conflict: {"message": "activekv-0.1.0.whl already exists in '
        'non-volatile index"}'
    )


def test_without_a_response_twines_own_error_is_reported() -> None:
    output = "Uploading x.whl\nERROR    ConnectionError: ('Connection aborted.', refused)\n"
    assert failure(output) == "ConnectionError: ('Connection aborted.', refused)"
    assert failure("") == "no output"


def test_markup_is_dropped_and_long_answers_are_cut() -> None:
    assert server_text("<html><title>t</title><body><h1>Bad</h1> <p>name&amp;</p></body>") == (
        "Bad name&"
    )
    assert len(server_text("x" * 5000)) == 400
