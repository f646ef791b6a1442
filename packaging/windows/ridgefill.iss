; Inno Setup 6 script: installs the PyInstaller folder dist\ridgefill\ as RidgeFill Desktop.
; NOT BUILT on this project's machines (Linux only); written for a Windows build host.
;
; On Windows, from the repository root, with Python 3.11 and the app's dependencies installed:
;   py -3.11 -m venv .venv
;   .venv\Scripts\pip install torch==2.13.0 -e ".[package]"
;   .venv\Scripts\python packaging\make_icon.py build\icons
;   set RIDGEFILL_ICON_DIR=build\icons
;   .venv\Scripts\python -m PyInstaller --noconfirm packaging\ridgefill.spec
;   dist\ridgefill\ridgefill-cli.exe --selftest
;   "C:\Program Files (x86)\Inno Setup 6\ISCC.exe" packaging\windows\ridgefill.iss
; Output: dist\RidgeFill-Setup-0.1.0.exe (per-user install by default, no admin rights needed).

#define AppName "RidgeFill Desktop"
#define AppVersion "0.1.0"
#define AppExe "RidgeFill.exe"
#define CliExe "ridgefill-cli.exe"
; paths are relative to this script (packaging\windows)
#define Repo "..\.."
#define Source Repo + "\dist\ridgefill"

[Setup]
AppId={{6B1F2C9E-8A4D-4E4B-9C57-2F0E2D7A51C3}
AppName={#AppName}
AppVersion={#AppVersion}
AppPublisher=RidgeFill Desktop maintainers
DefaultDirName={autopf}\RidgeFill
DefaultGroupName=RidgeFill
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir={#Repo}\dist
OutputBaseFilename=RidgeFill-Setup-{#AppVersion}
SetupIconFile={#Repo}\build\icons\ridgefill.ico
UninstallDisplayIcon={app}\{#AppExe}
; the bundle is ~1 GB, mostly torch and the model: LZMA2 solid compression pays off once
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked
Name: "addtopath"; Description: "Add the ridgefill-cli command to PATH"; Flags: unchecked

[Files]
Source: "{#Source}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExe}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExe}"; Tasks: desktopicon

[Registry]
; per-user PATH entry for the console twin (ridgefill-cli --selftest, ridgefill-cli chat ...)
Root: HKCU; Subkey: "Environment"; ValueType: expandsz; ValueName: "Path"; ValueData: "{olddata};{app}"; Tasks: addtopath; Check: NeedsAddPath(ExpandConstant('{app}'))

[Run]
Filename: "{app}\{#AppExe}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[Code]
function NeedsAddPath(Dir: string): Boolean;
var
  Paths: string;
begin
  if not RegQueryStringValue(HKEY_CURRENT_USER, 'Environment', 'Path', Paths) then
  begin
    Result := True;
    exit;
  end;
  Result := Pos(';' + Uppercase(Dir) + ';', ';' + Uppercase(Paths) + ';') = 0;
end;
