/* A tiny program built against the installed safecuda. */
#include <stdio.h>
#include <string.h>

#include <safecuda.h>

int main(void)
{
    int n = -1;
    sc_status s = sc_device_count(&n);
    printf("safecuda %s: sc_device_count -> %s (%d)\n", sc_version_string(), sc_status_name(s),
           n);
    if (s != SC_OK && s != SC_ERR_NO_DRIVER)
        return 1;
    return strcmp(sc_status_name(SC_ERR_STALE_HANDLE), "SC_ERR_STALE_HANDLE") == 0 ? 0 : 1;
}
